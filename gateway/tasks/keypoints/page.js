// Keypoints on the page (gateway/frontends/http/page.py has the contract): each instance's
// box and label in its own colour, its skeleton (the result's `skeleton`: edges {start, end}
// indexing each instance's `keypoints`; none, no lines) and its keypoints {name, x, y, score}
// as dots. As ultralytics' Annotator.kpts draws them, points and edges whose keypoints score
// under 0.5 are left out; the rows count them.
const VISIBLE = 0.5;
const instances = result.instances || [];
const skeleton = result.skeleton || [];
const seen = (point) => point && (point.score ?? 0) >= VISIBLE;
instances.forEach((instance, i) => {
  const colour = view.colour(i);
  const points = instance.keypoints || [];
  view.drawBox(instance.box, "", colour);
  for (const edge of skeleton) {
    const a = points[edge.start ?? 0], b = points[edge.end ?? 0];
    if (seen(a) && seen(b)) view.drawLine(a.x ?? 0, a.y ?? 0, b.x ?? 0, b.y ?? 0, colour);
  }
  for (const point of points) if (seen(point)) view.drawPoint(point.x ?? 0, point.y ?? 0, colour);
});
instances.forEach((instance, i) => {
  const points = instance.keypoints || [];
  const shown = points.filter(seen);
  view.drawLabel(instance.label + " " + (instance.score ?? 0).toFixed(2),
                 instance.box.x_min, instance.box.y_min, view.colour(i));
  const row = view.row(instance.label + " " + (instance.score ?? 0).toFixed(3) + ": " +
                       shown.length + " of " + points.length + " keypoints scoring " + VISIBLE +
                       " or more" + (shown.length ? " (" + shown.map((p) => p.name).join(", ") +
                       ")" : ""));
  row.style.borderLeft = "0.8em solid " + view.colour(i);
  row.style.paddingLeft = "4px";
});
view.status(instances.length + " instances by " + view.served(result));
