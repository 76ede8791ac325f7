// Checks pages of the built book in headless Chromium; see tools/browser_check.sh.
const { chromium } = require("playwright-core");
const fs = require("fs");
const path = require("path");

const BASE = process.env.BASE;
const MATHJAX_DIR = process.env.MATHJAX_DIR;
// The introduction and every chapter page: chapters after 0 (the appendices, 90 on, apart) must
// show a figure drawn by a cell (in its output, or pasted by {glue:figure}), exercises with (hidden)
// solutions, and a Colab button to their notebook twin; math must render without errors;
// no code block, output, equation or other element may be wider than the column, no rendered math
// may show a literal backslash, every figure has a caption, and every "chapter N" in the prose is
// a link. BOOK_PAGES (a comma-separated list of page stems) checks only those pages.
const chapters = fs.readdirSync(path.join(process.env.BOOK_DIR, "chapters"))
  .filter((f) => /^\d\d_.*\.html$/.test(f)).sort();
const ONLY = (process.env.BOOK_PAGES || "").split(",").filter(Boolean);
const ALL_PAGES = [{ url: "intro.html", name: "intro", math: false, figures: 0, exercises: 0 }].concat(
  chapters.map((f) => {
    const stem = f.replace(/\.html$/, "");
    const bare = stem.startsWith("00_") || /^9\d_/.test(stem);   // chapter 0, the appendices
    return { url: `chapters/${f}`, name: stem, math: stem.startsWith("01_"),
             figures: bare ? 0 : 1, exercises: bare ? 0 : 1, colab: `notebooks/${stem}.ipynb` };
  }));
const PAGES = ONLY.length ? ALL_PAGES.filter((p) => ONLY.includes(p.name)) : ALL_PAGES;

(async () => {
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  // Routes registered later win: block everything external first, then serve MathJax locally.
  await page.route(/^https?:\/\/(?!127\.0\.0\.1)/, (route) => route.abort());
  // Serve MathJax from the npm copy instead of the CDN (the check must work offline).
  await page.route(/cdn\.jsdelivr\.net\/npm\/mathjax@3\/(.*)$/, (route) => {
    const rel = route.request().url().match(/mathjax@3\/(.*)$/)[1];
    const file = path.join(MATHJAX_DIR, rel);
    if (fs.existsSync(file)) return route.fulfill({ path: file });
    return route.abort();
  });
  let failures = 0;
  for (const spec of PAGES) {
    await page.goto(`${BASE}/${spec.url}`, { waitUntil: "load" });
    if (spec.math) {
      await page.waitForSelector("mjx-container", { timeout: 20000 }).catch(() => {});
    }
    // Any page with math: measure it after MathJax has typeset it.
    await page.evaluate(() => window.MathJax && window.MathJax.startup
      && window.MathJax.startup.promise).catch(() => {});
    const seen = await page.evaluate(() => {
      // A figure a cell drew: its output, or a {glue:figure} pasted elsewhere on the page, whose
      // image myst-nb names after the hash of its content (a static image keeps its own name).
      const drawn = (img) => img.closest(".cell_output")
        || /\/_images\/[0-9a-f]{64}\.(png|jpe?g|svg)$/.test(img.src);
      return {
      title: document.title,
      math: document.querySelectorAll("mjx-container").length,
      mathErrors: document.querySelectorAll("mjx-merror").length,
      figures: [...document.querySelectorAll("img")].filter(
        (i) => i.complete && i.naturalWidth > 0 && drawn(i)).length,
      exercises: document.querySelectorAll(".exercise").length,
      solutions: document.querySelectorAll(".solution").length,
      colab: [...document.querySelectorAll("a")].map((a) => a.href)
        .filter((h) => h.includes("colab.research.google.com")),
      // Code and output must stay inside the text column (no sideways scrolling).
      wide: [...document.querySelectorAll("article pre")]
        .filter((el) => el.scrollWidth > el.clientWidth + 1)
        .map((el) => el.textContent.split("\n").find((l) => l.length > 0).slice(0, 60)),
      // Nothing else may be wider than the text column either: display math, images, tables,
      // figures. (A table in a cell's output scrolls inside its own box, which must itself fit;
      // code blocks are measured above.)
      overflowing: (() => {
        const article = document.querySelector("article") || document.body;
        const column = article.getBoundingClientRect();
        return [...article.querySelectorAll("*")]
          .filter((el) => !el.closest("pre") && !el.parentElement.closest(".cell_output table"))
          .filter((el) => {
            const box = el.getBoundingClientRect();
            return box.width > 0 && (box.right > column.right + 1 || box.left < column.left - 1);
          })
          .filter((el) => !el.closest("mjx-assistive-mml"))
          .map((el) => el.closest("mjx-container") || el)  // an equation counts once
          .filter((el, i, all) => all.indexOf(el) === i)
          .filter((el, _, all) => !all.some((other) => other !== el && other.contains(el)))
          .map((el) => {
            const words = el.querySelector("mjx-assistive-mml") || el;
            return `${el.tagName.toLowerCase()}: ${(words.textContent || el.getAttribute("src") || "")
              .trim().slice(0, 50)}`;
          })
          .slice(0, 10);
      })(),
      // MathJax shows a backslash it did not understand (\_ inside \text{}) as a character.
      mathBackslashes: [...document.querySelectorAll("mjx-container")]
        .filter((m) => m.querySelector("mjx-c.mjx-c5C")
          || [...m.querySelectorAll("mjx-utext, mjx-assistive-mml mtext, mjx-assistive-mml mi")]
            .some((t) => t.textContent.includes("\\")))
        .map((m) => (m.querySelector("mjx-assistive-mml") || m).textContent.trim().slice(0, 60)),
      // Every figure a cell draws has a number and a caption.
      uncaptioned: [...document.querySelectorAll("article img")].filter(drawn)
        .filter((img) => !(img.closest("figure") && img.closest("figure").querySelector("figcaption")))
        .length,
      // "chapter N" in the prose is a link.
      unlinked: (() => {
        const found = [];
        const article = document.querySelector("article") || document.body;
        const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
        while (walker.nextNode()) {
          const node = walker.currentNode;
          if (node.parentElement.closest("a, pre, code, .cell_output, h1, h2, h3, h4")) continue;
          for (const m of node.textContent.matchAll(/\b[Cc]hapters? \d{1,2}\b/g)) found.push(m[0]);
        }
        return found;
      })(),
      };
    });
    await page.screenshot({ path: `screenshots/${spec.name}.png`, fullPage: false });
    const problems = [];
    if (spec.math && (seen.math === 0 || seen.mathErrors > 0)) problems.push("math not rendered");
    if (seen.figures < spec.figures) problems.push(`expected >= ${spec.figures} figures`);
    if (seen.exercises < spec.exercises || seen.solutions < seen.exercises) problems.push("exercises/solutions");
    if (seen.mathErrors > 0) problems.push("math errors");
    if (spec.colab && !seen.colab.some((h) => h.endsWith(spec.colab))) problems.push("colab link");
    if (seen.wide.length) problems.push(`${seen.wide.length} code/output block(s) wider than the column`);
    if (seen.overflowing.length) problems.push(`element(s) wider than the column: ${seen.overflowing.join(" | ")}`);
    if (seen.mathBackslashes.length) problems.push(`literal backslash in math: ${seen.mathBackslashes.join(" | ")}`);
    if (seen.uncaptioned) problems.push(`${seen.uncaptioned} figure(s) without a caption`);
    if (seen.unlinked.length) problems.push(`${seen.unlinked.length} chapter mention(s) not linked`);
    failures += problems.length;
    console.log(JSON.stringify({ page: spec.url, ...seen, problems }));
  }
  await browser.close();
  if (failures) { console.error(`${failures} problem(s)`); process.exit(1); }
  console.log("browser check passed; screenshots in screenshots/");
})();
