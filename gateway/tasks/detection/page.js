// Detection on the page (gateway/frontends/http/page.py has the contract): every box in the
// first colour, then a label with class and score at each box's top-left corner.
const detections = result.detections || [];
for (const d of detections) view.drawBox(d.box);
for (const d of detections) {
  view.drawLabel(d.label + " " + (d.score ?? 0).toFixed(2), d.box.x_min, d.box.y_min);
  view.row(d.label + " " + (d.score ?? 0).toFixed(3) + " at (" + d.box.x_min + ", " +
           d.box.y_min + ")-(" + d.box.x_max + ", " + d.box.y_max + ")");
}
view.status(detections.length + " detections by " + view.served(result));
