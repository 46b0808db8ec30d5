// Counts the duration of the st.metric beside this component up, every second, from the
// seconds the server counted when it drew it (app/ticking_metric.py): a live run's elapsed
// time moves without a rerun. Only the metric's text node is rewritten, never replaced, so
// that React, which owns it, still updates it when the page is redrawn. Streamlit calls this
// function again on each redraw, but the function it returned only when the component leaves
// the page: so each call stops the count of the previous one.

const counts = new Map(); // component instance key -> the function that stops its count

// As app.views.duration writes it: `4m 05s`, `1h 07m`.
function duration(seconds) {
  const whole = Math.floor(seconds);
  const h = Math.floor(whole / 3600);
  const m = Math.floor((whole % 3600) / 60);
  const s = whole % 60;
  const two = (n) => String(n).padStart(2, "0");
  return h ? `${h}h ${two(m)}m` : `${m}m ${two(s)}s`;
}

function metricText(parentElement, container) {
  const value = parentElement
    .closest(`.${container}`)
    ?.querySelector('[data-testid="stMetricValue"]');
  if (!value) {
    return null;
  }
  return document.createTreeWalker(value, NodeFilter.SHOW_TEXT).nextNode();
}

export default function ({ data, key, parentElement }) {
  counts.get(key)?.();
  const drawnAt = performance.now();
  const show = () => {
    const text = metricText(parentElement, data.container);
    if (text) {
      text.nodeValue = duration(data.seconds + (performance.now() - drawnAt) / 1000);
    }
  };
  const timer = setInterval(show, 1000);
  const stop = () => {
    clearInterval(timer);
    if (counts.get(key) === stop) {
      counts.delete(key);
    }
  };
  counts.set(key, stop);
  return stop;
}
