// Instance segmentation on the page (gateway/frontends/http/page.py has the contract): each
// instance's mask as a translucent overlay in its own colour, then its box and a label with
// class and score. A mask is any of the forms segmentation.v1 answers with:
//   {"size": [h, w], "counts": "<string>"}  COCO compressed RLE, as pycocotools writes it
//                                          (column-major runs, first of zeros); a list of
//                                          numbers for counts is uncompressed RLE
//   {"polygons": [{"points": [x0, y0, x1, y1, ...]}, ...]}  (or [[x0, y0, ...], ...]) closed
//                                          outlines in image pixels, filled even-odd
//   {"png": "<base64>"}                    a PNG of the image's size, non-zero inside
const instances = result.instances || [];

// pycocotools' rleFrString (maskApi.c): 5 bits a character from '0', 0x20 = more follow,
// 0x10 on the last = negative; from the third count on, each is a delta from the one two
// before. Arithmetic, not bitwise: counts may pass 2^31 bits of shifting.
function rleCounts(text) {
  const counts = [];
  let p = 0;
  while (p < text.length) {
    let x = 0, k = 0, more = true;
    while (more) {
      if (p >= text.length) throw new Error("the mask's RLE counts end mid-number");
      const c = text.charCodeAt(p) - 48;
      if (c < 0 || c > 63) throw new Error("the mask's RLE counts hold " + JSON.stringify(text[p]));
      x += (c & 0x1f) * 2 ** (5 * k);
      more = (c & 0x20) !== 0;
      p++;
      k++;
      if (!more && (c & 0x10)) x -= 2 ** (5 * k);
    }
    if (counts.length > 2) x += counts[counts.length - 2];
    counts.push(x);
  }
  return counts;
}
// A row-major mask ({bits, width, height, area}) from COCO RLE: runs over the pixels in
// column-major order (down each column, then the next), alternately 0s and 1s.
function fromRle(mask) {
  const [height, width] = mask.size;
  const counts = Array.isArray(mask.counts) ? mask.counts.map(Number) : rleCounts(mask.counts);
  const total = counts.reduce((a, b) => a + b, 0);
  if (total !== width * height || counts.some((n) => n < 0)) {
    throw new Error("a mask's RLE covers " + total + " pixels, its size " + height + "x" +
                    width + " has " + width * height);
  }
  const bits = new Uint8Array(width * height);
  let i = 0, area = 0;
  for (let run = 0; run < counts.length; run++) {
    const end = i + counts[run];
    if (run % 2) {
      area += counts[run];
      for (; i < end; i++) bits[(i % height) * width + Math.floor(i / height)] = 1;
    }
    i = end;
  }
  return {bits: bits, width: width, height: height, area: area};
}
// A mask from what a 2D context can draw (polygons, an image): where it painted.
function fromDrawing(draw) {
  const layer = document.createElement("canvas");
  layer.width = view.width;
  layer.height = view.height;
  const ctx = layer.getContext("2d");
  draw(ctx);
  const pixels = ctx.getImageData(0, 0, layer.width, layer.height).data;
  const bits = new Uint8Array(layer.width * layer.height);
  let area = 0;
  for (let i = 0; i < bits.length; i++) {
    // Polygons: their fill's coverage; a PNG: non-zero grey (red) where opaque.
    bits[i] = pixels[4 * i + 3] >= 128 && pixels[4 * i] > 0 ? 1 : 0;
    area += bits[i];
  }
  return {bits: bits, width: layer.width, height: layer.height, area: area};
}
function fromPolygons(polygons) {
  return fromDrawing((ctx) => {
    ctx.beginPath();
    for (const polygon of polygons) {
      const xy = Array.isArray(polygon) ? polygon : (polygon.points || []);
      for (let j = 0; j + 1 < xy.length; j += 2) {
        if (j === 0) ctx.moveTo(xy[0], xy[1]);
        else ctx.lineTo(xy[j], xy[j + 1]);
      }
      ctx.closePath();
    }
    ctx.fillStyle = "#ffffff";
    ctx.fill("evenodd");
  });
}
async function fromPng(base64) {
  const bytes = Uint8Array.from(atob(base64.replace(/-/g, "+").replace(/_/g, "/")),
                                (c) => c.charCodeAt(0));
  const image = await createImageBitmap(new Blob([bytes], {type: "image/png"}),
                                        {colorSpaceConversion: "none", premultiplyAlpha: "none"});
  return fromDrawing((ctx) => {
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(image, 0, 0, view.width, view.height);
  });
}
// One of counts, png or polygons is set (the door also writes `"polygons": []` beside the
// other two, and no mask at all for a model without masks).
async function decode(mask) {
  if (!mask) return null;
  if (mask.counts !== undefined && mask.size) return fromRle(mask);
  if (mask.png) return fromPng(mask.png);
  if (mask.polygons) return fromPolygons(mask.polygons);
  return null;
}

const masks = [];
for (const [i, instance] of instances.entries()) {
  try {
    masks.push(await decode(instance.mask));
  } catch (error) {
    throw new Error("instance " + i + " (" + instance.label + "): " + (error.message || error));
  }
}
instances.forEach((instance, i) => {
  if (masks[i]) view.paintMask(masks[i].bits, masks[i].width, masks[i].height, view.colour(i));
});
instances.forEach((instance, i) => view.drawBox(instance.box, "", view.colour(i)));
instances.forEach((instance, i) => {
  const text = instance.label + " " + (instance.score ?? 0).toFixed(2);
  view.drawLabel(text, instance.box.x_min, instance.box.y_min, view.colour(i));
  const row = view.row(instance.label + " " + (instance.score ?? 0).toFixed(3) + ", " +
                       (masks[i] ? "mask of " + masks[i].area + " pixels" : "no mask"));
  row.style.borderLeft = "0.8em solid " + view.colour(i);
  row.style.paddingLeft = "4px";
});
view.status(instances.length + " instances by " + view.served(result));
