// An embedding on the page (gateway/frontends/http/page.py has the contract): nothing drawn
// over the image; its dimension, its L2 norm and its first values as rows.
const FIRST = 8;
const vector = (result.embedding || []).map(Number);
const norm = Math.sqrt(vector.reduce((sum, v) => sum + v * v, 0));
view.row("dimension " + (result.dimension ?? vector.length));
view.row("L2 norm " + norm.toFixed(4) + (result.normalized ? " (normalized)" : " (as the model gave it)"));
view.row("first values " + vector.slice(0, FIRST).map((v) => v.toFixed(4)).join(", ") +
         (vector.length > FIRST ? ", ..." : ""));
view.status("Embedding of dimension " + vector.length + " by " + view.served(result));
