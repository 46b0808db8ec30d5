// Asks the dashboard's live route (app/live_route.py) for the version of what this page
// shows, every data.every_ms, and asks Streamlit to rerun this component's fragment (a
// trigger) once the answer differs from the version the fragment was drawn with. Streamlit
// calls this function again, with the new version, each time the fragment redraws it, but
// calls the function it returned only when the component leaves the page: so each call
// stops the loop of the previous one, else every redraw would leave one more loop asking
// for reruns with an old version. The module is loaded once per page, so the components of
// one page that watch the same address share one request a round.

const answers = new Map(); // address -> {at: ms, answer: Promise of the route's JSON}
const loops = new Map(); // component instance key -> the function that stops its loop
const redraws = new Map(); // component instance key -> the end of the wait for its redraw
let triggers = Promise.resolve();
const REDRAW_WAIT_MS = 5000;

function askRoute(url, ticket, everyMs) {
  const kept = answers.get(url);
  if (kept && Date.now() - kept.at < everyMs / 2) {
    return kept.answer;
  }
  const answer = fetch(url, {
    headers: { Authorization: `Bearer ${ticket}` },
    cache: "no-store",
    credentials: "same-origin",
  })
    .then((response) => {
      if (response.status === 401) {
        return { expired: true }; // the fragment's rerun mints a new ticket
      }
      return response.ok ? response.json() : null;
    })
    .catch(() => null); // the dashboard is restarting: ask again next round
  answers.set(url, { at: Date.now(), answer });
  return answer;
}

// Streamlit sends the widget changes of one task as one rerun, of one fragment only, and a
// fragment's rerun asked for while another fragment's runs may leave the first undrawn: two
// watches that saw the same change would redraw one of their fragments. So a trigger waits
// until the fragment of the one before it was redrawn (this function called again for its
// watch), or REDRAW_WAIT_MS.
function triggerAfterRedraws(key, trigger) {
  triggers = triggers.then(
    () =>
      new Promise((done) => {
        const release = () => {
          clearTimeout(timeout);
          redraws.delete(key);
          done();
        };
        const timeout = setTimeout(release, REDRAW_WAIT_MS);
        redraws.set(key, release);
        trigger();
      }),
  );
}

function differs(answer, data) {
  if (answer.expired) {
    return "expired";
  }
  return answer.state === data.state ? null : answer.state;
}

export default function ({ data, key, setTriggerValue }) {
  redraws.get(key)?.();
  loops.get(key)?.();
  let timer;
  let stopped = false;
  let asked = null; // the version a rerun was asked for: asked once, in case it is slow
  const poll = async () => {
    const answer = await askRoute(data.url, data.ticket, data.every_ms);
    if (stopped) {
      return;
    }
    const changed = answer && differs(answer, data);
    if (changed && changed !== asked) {
      asked = changed;
      triggerAfterRedraws(key, () => setTriggerValue("changed", changed));
    }
    timer = setTimeout(poll, data.every_ms);
  };
  timer = setTimeout(poll, data.every_ms);
  const stop = () => {
    stopped = true;
    clearTimeout(timer);
    if (loops.get(key) === stop) {
      loops.delete(key);
    }
  };
  loops.set(key, stop);
  return stop;
}
