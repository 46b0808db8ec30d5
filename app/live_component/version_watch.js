// Asks the dashboard's live route (app/live_route.py) for the version of what this page
// shows, and asks Streamlit to rerun a watch's fragment (a trigger) once the answer differs
// from the version the fragment was drawn with. The route holds a request that names the
// version last answered (`?since=`) until the version changes, or a while (a long poll), and
// the page asks again as soon as it has an answer. One loop per address serves all the
// watches of the page on it, so that watches that see the same change trigger in their order
// (data.order: the status, which shows the step, before the charts). Streamlit calls this
// function again, with the new version, each time the fragment redraws it, but calls the
// function it returned only when the component leaves the page: so each call replaces the
// watch of the previous one, else every redraw would leave one more watch asking for reruns
// with an old version. The module is loaded once per page.

const loops = new Map(); // address -> its Loop
const redraws = new Map(); // component instance key -> the end of the wait for its redraw
const queue = []; // triggers waiting for their turn: {order, key, trigger}, in order
let triggering = false;
const REDRAW_WAIT_MS = 5000;

// Streamlit sends the widget changes of one task as one rerun, of one fragment only, and a
// fragment's rerun asked for while another fragment's runs may leave the first undrawn: two
// watches that saw the same change would redraw one of their fragments. So a trigger waits
// until the fragment of the one before it was redrawn (this function called again for its
// watch), or REDRAW_WAIT_MS; among those waiting, the lowest order goes first, and a watch
// waits with its newest trigger only.
function triggerInTurn(order, key, trigger) {
  const waiting = queue.find((item) => item.key === key);
  if (waiting) {
    waiting.trigger = trigger;
  } else {
    queue.push({ order, key, trigger });
    queue.sort((a, b) => a.order - b.order);
  }
  if (!triggering) {
    triggerNext();
  }
}

function triggerNext() {
  const item = queue.shift();
  triggering = Boolean(item);
  if (!item) {
    return;
  }
  const release = () => {
    clearTimeout(timeout);
    if (redraws.get(item.key) === release) {
      redraws.delete(item.key);
    }
    setTimeout(triggerNext); // not within Streamlit's call of this component
  };
  const timeout = setTimeout(release, REDRAW_WAIT_MS);
  redraws.set(item.key, release);
  item.trigger();
}

function forgetTrigger(key) {
  const index = queue.findIndex((item) => item.key === key);
  if (index >= 0) {
    queue.splice(index, 1);
  }
}

async function askRoute(url, ticket, since, signal) {
  const address = new URL(url);
  if (since !== null) {
    address.searchParams.set("since", since);
  }
  try {
    const response = await fetch(address, {
      headers: { Authorization: `Bearer ${ticket}` },
      cache: "no-store",
      credentials: "same-origin",
      signal,
    });
    if (response.status === 401) {
      return { expired: true }; // the fragment's rerun mints a new ticket
    }
    return response.ok ? await response.json() : null;
  } catch {
    return null; // abandoned, or the dashboard is restarting: ask again after a while
  }
}

// The version the route answers for `watch`'s fragment to be rerun for, or null.
function differs(answer, watch) {
  if (answer.expired) {
    return "expired";
  }
  return answer.state === watch.data.state ? null : answer.state;
}

// The watches of one address, with one request to the route at a time for all of them.
class Loop {
  constructor(url) {
    this.url = url;
    this.watches = new Map(); // component instance key -> {data, setTriggerValue, asked}
    this.ticket = null; // the newest watch's: an older one may have expired
    this.known = null; // the version the route answered last
    this.asking = null; // the request's AbortController
    this.timer = null; // the wait before asking again, after no answer
  }

  watch(key, data, setTriggerValue) {
    // asked: the version a rerun was asked for, asked once, in case it is slow
    this.watches.set(key, { data, setTriggerValue, asked: null });
    this.ticket = data.ticket;
    if (this.known === null) {
      this.known = data.state;
      this.ask(this.known);
    } else if (data.state !== this.known) {
      this.ask(null); // drawn from another version than the one known: the newest, now
    }
  }

  unwatch(key) {
    this.watches.delete(key);
    forgetTrigger(key);
    if (this.watches.size === 0) {
      this.stopAsking();
      loops.delete(this.url);
    }
  }

  stopAsking() {
    this.asking?.abort();
    clearTimeout(this.timer);
  }

  // Asks for the version once it differs from `since` (at once when null), replacing the
  // request in progress; triggers the watches drawn from another version, and asks again.
  async ask(since) {
    this.stopAsking();
    const asking = (this.asking = new AbortController());
    const answer = await askRoute(this.url, this.ticket, since, asking.signal);
    if (asking.signal.aborted) {
      return; // replaced, or every watch left the page
    }
    const inOrder = [...this.watches].sort(([, a], [, b]) => a.data.order - b.data.order);
    for (const [key, watch] of inOrder) {
      const changed = answer && differs(answer, watch);
      if (changed && changed !== watch.asked) {
        watch.asked = changed;
        triggerInTurn(watch.data.order, key, () => watch.setTriggerValue("changed", changed));
      }
    }
    if (answer?.state === undefined) {
      const [[, any]] = inOrder;
      this.timer = setTimeout(() => this.ask(this.known), any.data.retry_ms);
    } else {
      this.known = answer.state;
      this.ask(this.known);
    }
  }
}

export default function ({ data, key, setTriggerValue }) {
  redraws.get(key)?.();
  if (!loops.has(data.url)) {
    loops.set(data.url, new Loop(data.url));
  }
  const loop = loops.get(data.url);
  loop.watch(key, data, setTriggerValue);
  return () => {
    if (loop.watches.get(key)?.data === data) {
      loop.unwatch(key);
    }
  };
}
