// Classification on the page (gateway/frontends/http/page.py has the contract): the top
// classes as rows, the first one's label in the image's corner.
const classes = result.classes || [];
for (const c of classes) view.row(c.label + " " + (c.score ?? 0).toFixed(3));
if (classes.length) view.drawLabel(classes[0].label + " " + (classes[0].score ?? 0).toFixed(2), 0, 0);
view.status("Top classes by " + view.served(result));
