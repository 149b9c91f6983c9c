// toolfleet console: plain DOM, no framework, no build step. Every value from the API is
// put in the page as text (textContent), never as HTML.
"use strict";

(() => {
  const MAX_ROWS = 500;
  const $ = (sel, root = document) => root.querySelector(sel);
  const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
  const main = $("#main");

  const state = { config: null, selected: null, view: null, gPending: false, timer: null };

  // --- helpers -------------------------------------------------------------------------------
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") el.className = value;
      else if (key === "dataset") Object.assign(el.dataset, value);
      else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else if (value === true) el.setAttribute(key, "");
      else el.setAttribute(key, String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  async function api(path, options = {}) {
    const init = { method: options.method || "GET", headers: { Accept: "application/json" } };
    if (options.body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    if (init.method !== "GET" && state.config && state.config.csrf) {
      // The session's CSRF token: only this page can read it (from /api/config) and send it.
      init.headers["X-Toolfleet-CSRF"] = state.config.csrf;
    }
    const response = await fetch(path, init);
    let data = null;
    try { data = await response.json(); } catch (_) { data = null; }
    if (response.status === 401) signedOut();
    if (!response.ok) {
      throw new Error((data && data.error) || `${response.status} ${response.statusText}`);
    }
    return data;
  }

  // The session ended (expired, or signed out elsewhere): load the page again, which sends
  // the browser to sign in; once only, so that a console that keeps refusing shows why.
  function signedOut() {
    const last = Number(sessionStorage.getItem("toolfleet-signed-out") || 0);
    if (Date.now() - last > 10000) {
      sessionStorage.setItem("toolfleet-signed-out", String(Date.now()));
      location.reload();
    }
  }
  const post = (path, body) => api(path, { method: "POST", body: body || {} });

  const pad = (n) => String(n).padStart(2, "0");
  function clock(unix) {
    if (!unix) return "";
    const d = new Date(unix * 1000);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  function age(seconds) {
    if (seconds < 90) return `${Math.round(seconds)} s`;
    if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
    if (seconds < 172800) return `${Math.round(seconds / 3600)} h`;
    return `${Math.round(seconds / 86400)} d`;
  }
  const short = (digest) => (digest ? `${digest.slice(0, 12)}…` : "");
  function callHref(tenant, callId, runId) {
    const run = runId ? `?run=${encodeURIComponent(runId)}` : "";
    return `/calls/${encodeURIComponent(tenant)}/${encodeURIComponent(callId)}${run}`;
  }
  const badge = (cls, text) => h("span", { class: `status ${cls}` }, text);

  function banner(text, kind = "ok") {
    const el = $("#banner");
    el.textContent = text;
    el.className = kind;
    el.hidden = !text;
  }

  function setFeed(feed) {
    const el = $("#feed");
    el.className = `pill ${feed.state}`;
    el.textContent = `feed: ${feed.state}` + (feed.error && feed.state !== "live" ? ` (${feed.error})` : "");
    el.title = feed.error || "";
  }

  // Viewers see no decision buttons at all (the API refuses them anyway, with 403).
  const canDecide = () => Boolean(state.config && state.config.can_decide);
  function decisionButton(label, onclick, extra = {}) {
    if (!canDecide()) return null;
    return h("button", { type: "button", onclick, ...extra }, label);
  }

  // --- selection and keys --------------------------------------------------------------------
  const rows = () => $$("tr.row", main).filter((r) => !r.hidden);
  function select(row) {
    if (state.selected) state.selected.classList.remove("selected");
    state.selected = row || null;
    if (row) {
      row.classList.add("selected");
      row.scrollIntoView({ block: "nearest" });
    }
  }
  function move(step) {
    const all = rows();
    if (!all.length) return;
    const at = all.indexOf(state.selected);
    const next = at < 0 ? (step > 0 ? 0 : all.length - 1) : Math.min(all.length - 1, Math.max(0, at + step));
    select(all[next]);
  }
  function openSelected() {
    const href = state.selected && state.selected.dataset.href;
    if (href) location.href = href;
  }
  function typing(target) {
    return target && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName));
  }

  document.addEventListener("keydown", (event) => {
    const help = $("#help");
    if (event.key === "Escape") {
      if (help.open) return; // the dialog closes itself
      const form = document.activeElement && document.activeElement.closest("form.decision");
      if (form) { event.preventDefault(); form.dispatchEvent(new Event("cancel")); return; }
      if (typing(event.target)) { event.target.blur(); return; }
      select(null);
      return;
    }
    if (typing(event.target) || event.ctrlKey || event.metaKey || event.altKey) return;
    if (state.gPending) {
      state.gPending = false;
      const to = { l: "/", o: "/overview", h: "/history", t: "/tasks", c: "/circuits", f: "/fleet", b: "/bulk" }[event.key];
      if (to) { event.preventDefault(); location.href = to; }
      return;
    }
    switch (event.key) {
      case "/": {
        const filter = $("[data-filter]", main);
        if (filter) { event.preventDefault(); filter.focus(); filter.select(); }
        return;
      }
      case "j": event.preventDefault(); move(1); return;
      case "k": event.preventDefault(); move(-1); return;
      case "Enter":
        if (event.target.closest("a, button, form, dialog")) return; // theirs, not the row's
        if (state.selected) { event.preventDefault(); openSelected(); }
        return;
      case "g":
        state.gPending = true;
        setTimeout(() => { state.gPending = false; }, 1500);
        return;
      case "?": event.preventDefault(); help.showModal(); return;
      default:
        if (state.view && state.view.key) state.view.key(event);
    }
  });
  $("#help-button").addEventListener("click", () => $("#help").showModal());
  main.addEventListener("click", (event) => {
    const row = event.target.closest("tr.row");
    if (row && !event.target.closest("a, button, input, select, form")) select(row);
  });

  // A decision form under a row: confirm with Enter (submit), cancel with Esc or the button.
  function decisionForm(row, colspan, build, send) {
    closeForms();
    const fields = build();
    const form = h("form", { class: "decision" }, fields,
      h("button", { type: "submit", class: "primary" }, fields.confirm || "Confirm"),
      h("button", { type: "button", onclick: () => form.dispatchEvent(new Event("cancel")) }, "Cancel"));
    const formRow = h("tr", { class: "form-row" }, h("td", { colspan }, form));
    form.addEventListener("cancel", () => { formRow.remove(); row.focus && select(row); });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      $$("button", form).forEach((b) => { b.disabled = true; });
      try {
        const said = await send(new FormData(form));
        banner(said, "ok");
        formRow.remove();
        if (state.view && state.view.refresh) await state.view.refresh();
      } catch (error) {
        banner(`Not sent: ${error.message}`, "bad");
        $$("button", form).forEach((b) => { b.disabled = false; });
      }
    });
    row.after(formRow);
    const first = $("input, select, button", form);
    if (first) first.focus();
    return form;
  }
  function closeForms() { $$("tr.form-row", main).forEach((r) => r.remove()); }
  const formOpen = () => Boolean($("tr.form-row", main));
  function withLabel(fields, confirm) { fields.confirm = confirm; return fields; }

  function autoRefresh(refresh) {
    const every = ((state.config && state.config.refresh_s) || 2) * 1000;
    state.timer = setInterval(() => {
      if (document.hidden || formOpen() || typing(document.activeElement)) return;
      refresh().catch((error) => banner(`Refresh failed: ${error.message}`, "bad"));
    }, every);
  }

  // --- live: turns and outcomes --------------------------------------------------------------
  function live() {
    const params = new URLSearchParams(location.search);
    const scoped = state.config.tenant;
    const filters = {
      tenant: scoped || params.get("tenant") || "",
      run: params.get("run") || "",
      tool: params.get("tool") || "",
    };
    let outcomes = params.get("outcomes") !== "0";
    let source = null;

    const input = (name, label, extra = {}) => h("label", {}, label,
      h("input", { name, value: filters[name], size: 18, autocomplete: "off", spellcheck: "false", ...extra }));
    const outcomesBox = h("input", { type: "checkbox", name: "outcomes", checked: outcomes });
    const form = h("form", { class: "filters", role: "search" },
      input("tenant", "tenant", { "data-filter": true, disabled: Boolean(scoped), title: scoped ? "this console shows one tenant" : null }),
      input("run", "run"), input("tool", "tool"),
      h("label", {}, outcomesBox, "outcomes ", h("kbd", {}, "o")),
      h("button", { type: "submit" }, "Apply"),
      h("button", { type: "button", onclick: () => { for (const k of ["run", "tool"]) form.elements[k].value = ""; if (!scoped) form.elements.tenant.value = ""; apply(); } }, "Clear"));
    if (scoped) { // the tenant is fixed: "/" goes to the run filter
      form.elements.tenant.removeAttribute("data-filter");
      form.elements.run.setAttribute("data-filter", "");
    }

    const turnsBody = h("tbody", {});
    const outcomesBody = h("tbody", {});
    const turnsCount = h("span", { class: "count" });
    const outcomesCount = h("span", { class: "count" });
    const outcomesSection = h("section", { id: "outcomes-section" },
      h("h2", {}, "Outcomes ", outcomesCount),
      h("table", { id: "outcomes" },
        h("thead", {}, h("tr", {}, ["time", "tenant", "run", "call", "tool", "status", "effect", "attempt", "source"].map((t) => h("th", {}, t)))),
        outcomesBody));
    main.replaceChildren(form, h("div", { class: "columns" },
      h("section", {},
        h("h2", {}, "Turns ", turnsCount),
        h("table", { id: "turns" },
          h("thead", {}, h("tr", {}, ["time", "tenant", "run", "turn", "status", "calls"].map((t) => h("th", {}, t)))),
          turnsBody)),
      outcomesSection));

    function empty(body, text) {
      if (!body.querySelector("tr.row")) body.replaceChildren(h("tr", { class: "empty" }, h("td", { colspan: 9 }, text)));
    }
    function counts() {
      turnsCount.textContent = `(${turnsBody.querySelectorAll("tr.row").length})`;
      outcomesCount.textContent = `(${outcomesBody.querySelectorAll("tr.row").length})`;
    }
    function add(body, row) {
      const placeholder = body.querySelector("tr.empty");
      if (placeholder) placeholder.remove();
      body.prepend(row);
      while (body.children.length > MAX_ROWS) body.lastElementChild.remove();
      counts();
    }

    function turnRow(t) {
      const first = t.calls[0] || t.interruptions[0];
      const asked = new Set(t.interruptions.map((i) => i.call_id)); // shown as waiting instead
      const chips = t.calls.filter((c) => !asked.has(c.call_id)).map((c) => h("a", { class: "chip mono", href: callHref(t.tenant_id, c.call_id, t.run_id), title: `${c.call_id}: ${c.status}, ${c.effect}, ${c.attempts} attempt(s)` },
        `${c.tool_name} `, badge(`s-${c.status}`, c.status), " · ", badge(`e-${c.effect}`, c.effect)));
      const waiting = t.interruptions.map((i) => h("a", { class: "chip mono", href: "/tasks", title: i.reason || "waits for approval" },
        `${i.tool_name} `, badge("s-pending_approval", i.reason ? "held" : "awaiting approval")));
      const more = t.calls_total > t.calls.length ? h("span", { class: "muted" }, `+${t.calls_total - t.calls.length} more`) : null;
      const error = t.error ? h("div", { class: "error" }, `${t.error.type}: ${t.error.message}`) : null;
      return h("tr", {
        class: "row fresh",
        dataset: { kind: "turn", tenant: t.tenant_id, run: t.run_id, turn: String(t.turn_id), status: t.status, href: first ? callHref(t.tenant_id, first.call_id, t.run_id) : "" },
      },
      h("td", { class: "when" }, clock(t.received_at)),
      h("td", {}, t.tenant_id),
      h("td", { class: "mono" }, t.run_id),
      h("td", {}, String(t.turn_id)),
      h("td", {}, badge(`s-${t.status}`, t.status)),
      h("td", {}, chips, waiting, more, t.calls_total || t.interruptions.length ? null : h("span", { class: "muted" }, "no calls"), error));
    }

    function outcomeRow(o) {
      const href = callHref(o.tenant_id, o.call_id, o.run_id);
      return h("tr", { class: "row fresh", dataset: { kind: "outcome", tenant: o.tenant_id, run: o.run_id, call: o.call_id, href } },
        h("td", { class: "when" }, clock(o.received_at)),
        h("td", {}, o.tenant_id),
        h("td", { class: "mono" }, o.run_id),
        h("td", { class: "mono" }, h("a", { href }, o.call_id)),
        h("td", {}, o.action === "execute" ? o.tool_name : `${o.tool_name} (${o.action})`),
        h("td", {}, badge(`s-${o.status}`, o.status), o.error ? h("div", { class: "error" }, `${o.error.type}: ${o.error.message}`) : null),
        h("td", {}, badge(`e-${o.effect}`, o.effect)),
        h("td", {}, String(o.attempt)),
        h("td", {}, o.source));
    }

    // A call's progress (each event once: the feed drops duplicates), in the outcomes table.
    function progressRow(p) {
      const href = callHref(p.tenant_id, p.call_id, p.run_id);
      const total = p.total === null || p.total === undefined ? "" : ` / ${p.total}`;
      return h("tr", { class: "row fresh", dataset: { kind: "progress", tenant: p.tenant_id, run: p.run_id, call: p.call_id, attempt: String(p.attempt), sequence: String(p.sequence), href } },
        h("td", { class: "when" }, clock(p.received_at)),
        h("td", {}, p.tenant_id),
        h("td", { class: "mono" }, p.run_id),
        h("td", { class: "mono" }, h("a", { href }, p.call_id)),
        h("td", {}, p.tool_name),
        h("td", {}, badge("s-progress", `progress ${p.done}${total}`), p.message ? h("div", { class: "muted" }, p.message) : null),
        h("td", {}, "-"),
        h("td", {}, String(p.attempt)),
        h("td", {}, `tool #${p.sequence}`));
    }

    function connect() {
      if (source) source.close();
      document.body.dataset.stream = "connecting";
      turnsBody.replaceChildren();
      outcomesBody.replaceChildren();
      empty(turnsBody, "Waiting for turns: the console shows what happens from its start on.");
      empty(outcomesBody, "Waiting for outcomes.");
      counts();
      outcomesSection.hidden = !outcomes;
      const query = new URLSearchParams();
      for (const [k, v] of Object.entries(filters)) if (v && !(k === "tenant" && scoped)) query.set(k, v);
      if (!outcomes) query.set("outcomes", "0");
      const shown = query.toString();
      history.replaceState(null, "", shown ? `/?${shown}` : "/");
      source = new EventSource(`/events${shown ? `?${shown}` : ""}`);
      source.addEventListener("status", (e) => setFeed(JSON.parse(e.data)));
      source.addEventListener("turn", (e) => add(turnsBody, turnRow(JSON.parse(e.data))));
      source.addEventListener("outcome", (e) => add(outcomesBody, outcomeRow(JSON.parse(e.data))));
      source.addEventListener("progress", (e) => add(outcomesBody, progressRow(JSON.parse(e.data))));
      source.addEventListener("dropped", (e) => {
        const n = JSON.parse(e.data).count;
        banner(`${n} event(s) were dropped: this page fell behind the feed. Reload to see everything again.`, "warn");
      });
      source.onopen = () => { document.body.dataset.stream = "open"; };
      source.onerror = () => {
        document.body.dataset.stream = "closed";
        if (source.readyState !== EventSource.CLOSED) {
          setFeed({ state: "connecting", error: "lost the console; reconnecting" });
          return;
        }
        // Refused (not a lost connection): the API says why, e.g. a tenant out of scope.
        setFeed({ state: "down", error: "the console refused this stream" });
        api(`/api/recent?${new URLSearchParams({ ...Object.fromEntries(query), limit: "0" })}`)
          .then(() => banner("The live stream closed: reload the page.", "warn"))
          .catch((error) => banner(`Not shown: ${error.message}`, "bad"));
      };
    }
    function apply() {
      for (const k of Object.keys(filters)) filters[k] = scoped && k === "tenant" ? scoped : form.elements[k].value.trim();
      outcomes = outcomesBox.checked;
      select(null);
      connect();
    }
    form.addEventListener("submit", (event) => { event.preventDefault(); apply(); document.activeElement.blur(); });
    outcomesBox.addEventListener("change", apply);
    connect();
    return {
      key(event) {
        if (event.key === "o") { outcomesBox.checked = !outcomesBox.checked; apply(); }
      },
    };
  }

  // --- tasks and approvals -------------------------------------------------------------------
  const RESOLUTIONS = {
    applied: "applied: it happened (give the output the model sees)",
    not_applied: "not applied: it did not happen",
    wrong_effect: "wrong effect: it happened wrongly (ask to compensate)",
    approve_compensation: "approve the compensation",
    reject_compensation: "reject the compensation",
  };
  const FIRST_CHOICE = { unknown_effect: "applied", compensation_approval: "approve_compensation" };

  function tasks() {
    const filter = h("input", { "data-filter": true, placeholder: "filter: tenant, run, call, tool…", size: 32, autocomplete: "off" });
    const showResolved = h("input", { type: "checkbox" });
    const approvalsBody = h("tbody", {});
    const tasksBody = h("tbody", {});
    const approvalsCount = h("span", { class: "count" });
    const tasksCount = h("span", { class: "count" });
    main.replaceChildren(
      h("div", { class: "filters" }, h("label", {}, "filter ", filter), h("label", {}, showResolved, "resolved tasks too")),
      h("h2", {}, "Waiting for approval ", approvalsCount),
      h("table", { id: "approvals" },
        h("thead", {}, h("tr", {}, ["tenant", "run", "call", "tool", "arguments (sha256)", "decision", ""].map((t) => h("th", {}, t)))),
        approvalsBody),
      h("h2", {}, "Human tasks ", tasksCount),
      h("table", { id: "tasks" },
        h("thead", {}, h("tr", {}, ["task", "kind", "tenant", "subject", "why", "age", "status", ""].map((t) => h("th", {}, t)))),
        tasksBody));

    function matches(row) {
      const needle = filter.value.trim().toLowerCase();
      return !needle || row.textContent.toLowerCase().includes(needle);
    }
    function applyFilter() { for (const row of rows().concat($$("tr.row[hidden]", main))) row.hidden = !matches(row); }
    filter.addEventListener("input", applyFilter);
    showResolved.addEventListener("change", () => refresh());

    function approve(row, a) {
      decisionForm(row, 7, () => withLabel([
        h("span", {}, "Approve ", h("b", {}, a.tool_name), ` call ${a.call_id} of run ${a.run_id} (tenant ${a.tenant_id}) as ${state.config.operator}?`),
      ], "Confirm approve"), async () => {
        await post("/api/approvals/decide", { tenant_id: a.tenant_id, run_id: a.run_id, call_id: a.call_id, approve: true });
        return `Approved ${a.call_id} as ${state.config.operator}: the agent runtime's resumed turn runs it.`;
      });
    }
    function reject(row, a) {
      decisionForm(row, 7, () => withLabel([
        h("span", {}, "Reject ", h("b", {}, a.tool_name), ` call ${a.call_id}?`),
        h("label", {}, "message to the model", h("input", { name: "message", size: 40, placeholder: "(default rejection text)" })),
      ], "Confirm reject"), async (data) => {
        await post("/api/approvals/decide", { tenant_id: a.tenant_id, run_id: a.run_id, call_id: a.call_id, approve: false, message: data.get("message") || null });
        return `Rejected ${a.call_id} as ${state.config.operator}.`;
      });
    }
    function resolve(row, t) {
      const choice = FIRST_CHOICE[t.kind] || "applied";
      decisionForm(row, 8, () => {
        const select = h("select", { name: "resolution" },
          Object.entries(RESOLUTIONS).map(([value, label]) => h("option", { value, selected: value === choice }, label)));
        const output = h("label", {}, "output", h("input", { name: "output", size: 30, placeholder: "what the model sees" }));
        const sync = () => { output.hidden = select.value !== "applied"; };
        select.addEventListener("change", sync);
        sync();
        return withLabel([h("span", {}, `Resolve ${t.task_id} as`), select, output,
          h("label", {}, "note", h("input", { name: "note", size: 24, placeholder: "kept in the audit chain" }))], "Confirm resolve");
      }, async (data) => {
        const resolution = data.get("resolution");
        await post(`/api/tasks/${encodeURIComponent(t.task_id)}/resolve`, {
          resolution, output: resolution === "applied" ? data.get("output") || "" : null, note: data.get("note") || null,
        });
        return `Sent: ${t.task_id} → ${resolution} (by ${state.config.operator}); the reconciler carries it out.`;
      });
    }

    function assign(row, t) {
      decisionForm(row, 8, () => withLabel([h("span", {}, `Assign ${t.task_id} to`),
        h("input", { name: "to", size: 24, value: t.assignee ? t.assignee.to : state.config.operator, placeholder: "empty: nobody" })], "Confirm assign"),
      async (data) => {
        const to = String(data.get("to") || "").trim();
        await post(`/api/tasks/${encodeURIComponent(t.task_id)}/assign`, { to });
        return to ? `${t.task_id} is ${to}'s now.` : `${t.task_id} is nobody's now.`;
      });
    }

    function approvalRow(a) {
      const decided = a.decision
        ? h("span", {}, badge(a.decision.approve ? "s-completed" : "s-rejected", a.decision.approve ? "approved" : "rejected"),
          ` by ${a.decision.by} at ${clock(a.decision.at)}; waiting for the turn's resume`)
        : h("span", { class: "muted" }, a.held ? "held after a wrong effect in the run" : "undecided");
      const row = h("tr", { class: "row", id: `approval-${a.tenant_id}-${a.call_id}`, dataset: { kind: "approval", tenant: a.tenant_id, run: a.run_id, call: a.call_id, href: callHref(a.tenant_id, a.call_id, a.run_id) } },
        h("td", {}, a.tenant_id), h("td", { class: "mono" }, a.run_id),
        h("td", { class: "mono" }, h("a", { href: callHref(a.tenant_id, a.call_id, a.run_id) }, a.call_id)),
        h("td", {}, a.tool_version ? `${a.tool_name}@${a.tool_version}` : a.tool_name),
        h("td", { class: "mono", title: a.arguments_digest }, `${short(a.arguments_digest)} (${a.arguments_bytes} B)`),
        h("td", {}, decided),
        h("td", { class: "actions" }, a.decision ? null : [
          decisionButton("Approve", () => approve(row, a)),
          decisionButton("Reject", () => reject(row, a), { class: "danger" }),
        ]));
      row._approve = a.decision ? null : () => approve(row, a);
      row._reject = a.decision ? null : () => reject(row, a);
      return row;
    }
    function taskRow(t) {
      const subject = t.call_id
        ? h("a", { class: "mono", href: callHref(t.tenant_id, t.call_id, t.run_id) }, t.run_id ? `${t.run_id}/${t.call_id}` : t.call_id)
        : h("a", { class: "mono", href: "/circuits" }, `${t.tool_name}@${t.tool_version}`);
      const open = t.status === "open";
      const actions = !open ? (t.resolution ? `${t.resolution.resolution} by ${t.resolution.decided_by}` : "")
        : [t.call_id ? decisionButton("Resolve…", () => resolve(row, t)) : h("a", { href: "/circuits" }, "resume the circuit…"),
          " ", decisionButton("Assign…", () => assign(row, t))];
      const row = h("tr", { class: "row", id: `task-${t.task_id}`, dataset: { kind: "task", task: t.task_id, tenant: t.tenant_id, href: t.call_id ? callHref(t.tenant_id, t.call_id, t.run_id) : "/circuits" } },
        h("td", { class: "mono" }, t.task_id), h("td", {}, t.kind.replace(/_/g, " ")), h("td", {}, t.tenant_id),
        h("td", {}, subject, t.calls && t.calls.length ? h("details", { class: "muted task-calls" },
          h("summary", {}, `${t.calls.length} call(s) ran while it failed`),
          (t.call_refs || []).map((c) => h("div", { class: "mono" }, c.run_id ? h("a", { href: callHref(t.tenant_id, c.call_id, c.run_id) }, `${c.run_id}/${c.call_id}`) : c.call_id))) : null),
        h("td", {}, t.reason), h("td", { class: "when" }, age(t.age_s)),
        h("td", { class: "task-status" }, badge(`s-${t.status}`, t.status), t.assignee ? h("span", { class: "assignee", title: `assigned by ${t.assignee.by}` }, ` · ${t.assignee.to}`) : null),
        h("td", { class: "actions" }, actions));
      row._resolve = open && t.call_id && canDecide() ? () => resolve(row, t) : null;
      return row;
    }

    async function refresh() {
      const [approvals, found] = await Promise.all([
        api("/api/approvals"), api(`/api/tasks${showResolved.checked ? "?all=1" : ""}`),
      ]);
      if (formOpen()) return; // an operator is deciding: leave the rows as they are
      const keep = state.selected && state.selected.id;
      approvalsBody.replaceChildren(...approvals.approvals.map(approvalRow));
      tasksBody.replaceChildren(...found.tasks.map(taskRow));
      if (!approvals.approvals.length) approvalsBody.append(h("tr", { class: "empty" }, h("td", { colspan: 7 }, "No call waits for approval.")));
      if (!found.tasks.length) tasksBody.append(h("tr", { class: "empty" }, h("td", { colspan: 8 }, "No open human task.")));
      approvalsCount.textContent = `(${approvals.approvals.length})`;
      tasksCount.textContent = `(${found.tasks.length})`;
      applyFilter();
      select(keep ? document.getElementById(keep) : null);
    }
    refresh().catch((error) => banner(`Could not load: ${error.message}`, "bad"));
    autoRefresh(refresh);
    return {
      refresh,
      key(event) {
        const row = state.selected;
        if (!row || !canDecide()) return;
        const act = { a: row._approve, x: row._reject, r: row._resolve }[event.key];
        if (act) { event.preventDefault(); act(); }
      },
    };
  }

  // --- circuits and versions -----------------------------------------------------------------
  function circuits() {
    const filter = h("input", { "data-filter": true, placeholder: "filter: tool, version…", size: 28, autocomplete: "off" });
    const circuitsBody = h("tbody", {});
    const toolsBody = h("tbody", {});
    const circuitsCount = h("span", { class: "count" });
    main.replaceChildren(
      h("div", { class: "filters" }, h("label", {}, "filter ", filter)),
      h("h2", {}, "Open circuits ", circuitsCount),
      h("table", { id: "circuits" }, h("thead", {}, h("tr", {}, ["tool version", "open since", "failed", ""].map((t) => h("th", {}, t)))), circuitsBody),
      h("h2", {}, "Tool versions"),
      h("table", { id: "tools" }, h("thead", {}, h("tr", {}, ["tool", "version", "pool", "effect class", "circuit", "new calls", ""].map((t) => h("th", {}, t)))), toolsBody));
    let actions = false;
    filter.addEventListener("input", () => { for (const row of $$("tr.row", main)) row.hidden = !row.textContent.toLowerCase().includes(filter.value.trim().toLowerCase()); });
    // Fleet-wide actions touch every tenant: only an admin of every tenant sees their buttons.
    const fleetWide = (label, onclick, extra = {}) => actions ? decisionButton(label, onclick, extra) : null;

    function resume(row, c) {
      decisionForm(row, 4, () => withLabel([h("span", {}, `Close the circuit of ${c.ref}? Reconcile the calls its task lists first.`)], "Confirm resume"), async () => {
        const done = await post(`/api/circuits/${encodeURIComponent(c.ref)}/resume`);
        return `${c.ref}: ${done.closed ? "closed" : "was not open"}.`;
      });
    }
    function rollback(row, tool, v) {
      decisionForm(row, 7, () => withLabel([h("span", {}, `Send new calls of ${tool.name} to ${v.ref} (a pin, until unpinned)?`)], "Confirm rollback"), async () => {
        const done = await post(`/api/tools/${encodeURIComponent(tool.name)}/rollback`, { version: v.version });
        return done.message;
      });
    }
    function unpin(row, tool) {
      decisionForm(row, 7, () => withLabel([h("span", {}, `Drop the pin of ${tool.name} (new calls go to the newest healthy version)?`)], "Confirm unpin"), async () => {
        const done = await post(`/api/tools/${encodeURIComponent(tool.name)}/unpin`);
        return `${tool.name}: ${done.unpinned ? "unpinned" : "was not pinned"}.`;
      });
    }

    async function refresh() {
      const data = await api("/api/circuits");
      if (formOpen()) return; // an operator is deciding: leave the rows as they are
      actions = data.actions;
      const keep = state.selected && state.selected.id;
      circuitsBody.replaceChildren(...data.circuits.map((c) => {
        const row = h("tr", { class: "row", id: `circuit-${c.ref}`, dataset: { kind: "circuit", ref: c.ref } },
          h("td", { class: "mono" }, c.ref), h("td", { class: "when" }, clock(c.opened_at)),
          h("td", {}, `${c.failed} of ${c.calls} calls`),
          h("td", { class: "actions" }, fleetWide("Resume…", () => resume(row, c))));
        return row;
      }));
      if (!data.circuits.length) circuitsBody.append(h("tr", { class: "empty" }, h("td", { colspan: 4 }, "No circuit is open.")));
      circuitsCount.textContent = `(${data.circuits.length})`;
      toolsBody.replaceChildren(...data.tools.flatMap((tool) => tool.versions.map((v, i, all) => {
        const chosen = all.findIndex((x) => x.new_calls);
        const circuit = v.circuit ? badge("c-open", `open: ${v.circuit.failed} of ${v.circuit.calls} failed`) : badge("c-closed", "closed");
        const routing = v.new_calls ? h("span", {}, "◀ ", tool.new_calls.why) : null;
        const row = h("tr", { class: "row", id: `version-${v.ref}`, dataset: { kind: "version", ref: v.ref } },
          h("td", {}, i === 0 ? tool.name : ""), h("td", { class: "mono" }, v.version), h("td", {}, v.pool), h("td", {}, v.effect_class),
          h("td", {}, circuit), h("td", {}, routing),
          h("td", { class: "actions" },
            v.new_calls ? null : fleetWide(i > chosen ? "Roll back here…" : "Pin here…", () => rollback(row, tool, v)),
            tool.pin === v.version ? fleetWide("Unpin…", () => unpin(row, tool)) : null));
        return row;
      })));
      if (!data.tools.length) toolsBody.append(h("tr", { class: "empty" }, h("td", { colspan: 7 }, "No tool is published.")));
      select(keep ? document.getElementById(keep) : null);
    }
    refresh().catch((error) => banner(`Could not load: ${error.message}`, "bad"));
    autoRefresh(refresh);
    return { refresh };
  }

  // --- overview: charts of the last minutes and hours ----------------------------------------
  const PALETTE = ["#6cb6ff", "#56d364", "#ff7b72", "#e3b341", "#d2a8ff", "#ffa657", "#79c0ff", "#a5d6ff", "#f778ba", "#7ee787"];
  function overviewPage() {
    const spans = ["15m", "1h", "6h", "24h", "7d"];
    let span = new URLSearchParams(location.search).get("span") || "1h";
    const picker = h("div", { class: "filters", role: "group", "aria-label": "span" }, spans.map((s) => h("button", { type: "button", dataset: { span: s }, "aria-pressed": String(s === span), onclick: () => { span = s; for (const b of $$("[data-span]", picker)) b.setAttribute("aria-pressed", String(b.dataset.span === span)); history.replaceState(null, "", `/overview?span=${s}`); refresh().catch(failed); } }, s)));
    const grid = h("div", { class: "charts", id: "charts" });
    const status = h("p", { class: "muted", id: "overview-status" });
    const shares = h("tbody", {});
    main.replaceChildren(h("h1", {}, "Overview"), picker, status, grid,
      h("h2", {}, "Tenants: their share of the calls against their weight's"),
      h("table", { id: "overview-tenants" }, h("thead", {}, h("tr", {}, ["tenant", "calls", "share of calls", "share by weight now", "waiting now"].map((t) => h("th", {}, t)))), shares));
    const charts = new Map();
    const failed = (error) => banner(`Could not load: ${error.message}`, "bad");
    function draw(id, title, xs, lines, unit) {
      let box = charts.get(id);
      const names = Object.keys(lines);
      const data = [xs, ...names.map((n) => lines[n])];
      if (box && box.names.join("\u001f") === names.join("\u001f")) { box.plot.setData(data); return; }
      if (box) { box.plot.destroy(); box.el.remove(); }
      const el = h("figure", { class: "chart", id }, h("figcaption", {}, title));
      grid.append(el);
      const width = Math.max(320, Math.min(640, (grid.clientWidth || 1200) / 2 - 24));
      const plot = new uPlot({
        width, height: 200, legend: { show: true },
        scales: { x: { time: true } },
        axes: [{ stroke: "#a9b3bf", grid: { stroke: "#2c3440" } }, { stroke: "#a9b3bf", grid: { stroke: "#2c3440" }, size: 72, values: (_u, ticks) => ticks.map((v) => `${Number(v.toPrecision(3))}${unit}`) }],
        // Points as well as lines: a bucket with one sample between gaps is still seen.
        series: [{}, ...names.map((n, i) => ({ label: n, stroke: PALETTE[i % PALETTE.length], width: 2, spanGaps: false, points: { show: true, size: 4 } }))],
      }, data, el);
      charts.set(id, { plot, el, names });
    }
    const pick = (prefix, gauges) => Object.fromEntries(Object.entries(gauges).filter(([k]) => k.startsWith(prefix)).map(([k, v]) => [k.slice(prefix.length), v]));
    async function refresh() {
      const [data, tenants] = await Promise.all([api(`/api/overview?span=${span}`), api("/api/tenants")]);
      const xs = data.starts;
      const byStatus = Object.fromEntries(Object.entries(data.calls).filter(([k]) => k.startsWith("status:")).map(([k, v]) => [k.slice(7), v]));
      const byEffect = Object.fromEntries(Object.entries(data.calls).filter(([k]) => k.startsWith("effect:")).map(([k, v]) => [k.slice(7), v]));
      draw("chart-status", "Calls per second, by status", xs, Object.keys(byStatus).length ? byStatus : { none: xs.map(() => 0) }, "/s");
      draw("chart-effect", "Calls per second, by effect", xs, Object.keys(byEffect).length ? byEffect : { none: xs.map(() => 0) }, "/s");
      draw("chart-latency", "Turn latency (model response to result)", xs, { p50: data.latency_p50_s, p99: data.latency_p99_s }, " s");
      const capacity = pick("pool.capacity|", data.gauges);
      const running = pick("pool.running|", data.gauges);
      const saturation = Object.fromEntries(Object.keys(capacity).map((p) => [p, capacity[p].map((c, i) => (c && running[p] && running[p][i] !== null ? (100 * running[p][i]) / c : null))]));
      draw("chart-saturation", "Pools: running calls / slots", xs, Object.keys(saturation).length ? saturation : { none: xs.map(() => null) }, "%");
      const lag = pick("pool.lag|", data.gauges);
      draw("chart-lag", "Pools: commands not yet taken (lag)", xs, Object.keys(lag).length ? lag : { none: xs.map(() => null) }, "");
      const waiting = pick("tenant.waiting|", data.gauges);
      draw("chart-waiting", "Tenants: calls waiting for admission", xs, Object.keys(waiting).length ? waiting : { none: xs.map(() => null) }, "");
      draw("chart-attention", "Waiting for people: open tasks and unknown effects", xs, { "open tasks": data.gauges["tasks.open|all"] || xs.map(() => null), "unknown effects": data.gauges["unknown.open|all"] || xs.map(() => null) }, "");
      const total = Object.values(data.tenants).reduce((a, b) => a + b, 0);
      const now = Object.fromEntries(tenants.tenants.map((t) => [t.tenant_id, t]));
      const names = Object.keys(data.tenants).sort((a, b) => data.tenants[b] - data.tenants[a]).slice(0, 50);
      shares.replaceChildren(...names.map((name) => {
        const share = total ? data.tenants[name] / total : 0;
        const t = now[name];
        const fair = t && t.fair_share !== null ? `${Math.round(t.fair_share * 100)}%` : "idle";
        return h("tr", { class: "row", dataset: { tenant: name } }, h("td", {}, name), h("td", {}, String(data.tenants[name])),
          h("td", {}, meterOf(share), ` ${Math.round(share * 100)}%`), h("td", {}, fair), h("td", {}, t ? String(t.waiting) : "0"));
      }));
      if (!names.length) shares.append(h("tr", { class: "empty" }, h("td", { colspan: 5 }, "No call in this span.")));
      status.textContent = `${span} in ${data.width === 60 ? "minutes" : "hours"} · ${total} calls · overview job ${data.job.state}${data.job.error ? ` (${data.job.error})` : ""}`;
      document.body.dataset.charts = String(charts.size);
    }
    function meterOf(value) {
      const fill = h("span", {});
      fill.style.width = `${Math.max(0, Math.min(1, value || 0)) * 100}%`;
      return h("span", { class: "meter" }, fill);
    }
    refresh().catch(failed);
    autoRefresh(refresh);
    return { refresh };
  }

  // --- history: search, page, open a run -----------------------------------------------------
  const runHref = (tenant, runId) => `/runs/${encodeURIComponent(tenant)}/${encodeURIComponent(runId)}`;
  function when(unix) {
    if (!unix) return "";
    const d = new Date(unix * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock(unix)}`;
  }
  function historyPage() {
    const params = new URLSearchParams(location.search);
    const FIELDS = ["tenant", "run", "call", "tool", "version", "status", "call_status", "effect", "decider"];
    const input = (name) => h("input", { name, id: `history-${name}`, size: 14, autocomplete: "off", value: params.get(name) || "" });
    const kind = h("select", { name: "kind", id: "history-kind" }, ["turn", "decision", "task", "cancellation"].map((k) => h("option", { value: k, selected: (params.get("kind") || "turn") === k }, k)));
    const since = h("input", { name: "since", id: "history-since", type: "datetime-local", value: params.get("since") || "" });
    const until = h("input", { name: "until", id: "history-until", type: "datetime-local", value: params.get("until") || "" });
    const form = h("form", { id: "history-form", class: "filters" },
      h("label", {}, "kind ", kind), ...FIELDS.map((f) => h("label", {}, `${f.replace("_", " ")} `, input(f))),
      h("label", {}, "since ", since), h("label", {}, "until ", until),
      h("button", { type: "submit", id: "history-search" }, "Search"));
    const body = h("tbody", {});
    const info = h("p", { id: "history-info", class: "muted" });
    const newer = h("button", { type: "button", id: "history-newer", disabled: true }, "← Newer");
    const older = h("button", { type: "button", id: "history-older", disabled: true }, "Older →");
    const act = h("span", { id: "history-act" });
    main.replaceChildren(h("h1", {}, "History"), form,
      h("table", { id: "history" }, h("thead", {}, h("tr", {}, ["time", "tenant", "kind", "run", "turn", "status", "calls", "by"].map((t) => h("th", {}, t)))), body),
      h("p", {}, newer, " ", older, " ", info, " ", act));
    const pages = [null]; // the cursor of each page shown so far (the first has none)
    let at = 0;
    function query(cursor) {
      const q = new URLSearchParams();
      for (const [k, v] of new FormData(form).entries()) {
        const text = String(v).trim();
        if (!text) continue;
        // datetime-local is the browser's local time: send it as an absolute time.
        q.set(k, (k === "since" || k === "until") ? String(new Date(text).getTime() / 1000) : text);
      }
      if (cursor) q.set("cursor", cursor);
      return q;
    }
    function summary(e) {
      const calls = e.calls || [];
      const counts = {};
      for (const c of calls) counts[c.status] = (counts[c.status] || 0) + 1;
      return Object.entries(counts).map(([k, n]) => `${n} ${k}`).join(", ") || (calls.length ? "" : "—");
    }
    async function load() {
      const q = query(pages[at]);
      q.set("limit", "50");
      const data = await api(`/api/history?${q}`);
      const shown = new URLSearchParams(query(null));
      history.replaceState(null, "", `/history${shown.toString() ? `?${shown}` : ""}`);
      body.replaceChildren(...data.entries.map((e) => h("tr", { class: "row", dataset: { href: e.run_id ? runHref(e.tenant_id, e.run_id) : "", run: e.run_id || "", tenant: e.tenant_id } },
        h("td", { class: "when" }, when(e.at)), h("td", {}, e.tenant_id), h("td", {}, e.kind || kind.value),
        h("td", { class: "mono" }, e.run_id ? h("a", { href: runHref(e.tenant_id, e.run_id) }, e.run_id) : "—"),
        h("td", {}, e.turn_id === undefined || e.turn_id === null ? "" : String(e.turn_id)),
        h("td", {}, badge(`s-${e.status}`, e.status || "")), h("td", {}, summary(e)),
        h("td", {}, [...new Set((e.calls || []).map((c) => c.decided_by).filter(Boolean))].join(", ")))));
      if (!data.entries.length) body.append(h("tr", { class: "empty" }, h("td", { colspan: 8 }, data.cursor ? "Nothing in this stretch: look older." : "Nothing found.")));
      if (pages.length === at + 1 && data.cursor) pages.push(data.cursor);
      newer.disabled = at === 0;
      older.disabled = !(pages.length > at + 1);
      info.textContent = `page ${at + 1} · ${data.entries.length} shown · ${data.looked} index entries read` + (data.recording.state !== "recording" ? ` · history ${data.recording.state}` : "");
      const tenant = new FormData(form).get("tenant");
      const runs = [...new Set(data.entries.map((e) => e.run_id).filter(Boolean))];
      act.replaceChildren(canDecide() && tenant && runs.length
        ? h("a", { id: "history-cancel", href: `/bulk?${new URLSearchParams({ action: "cancel", tenant: String(tenant), runs: runs.join("\n") })}` }, `Cancel these ${runs.length} runs…`)
        : "");
    }
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      pages.splice(1); at = 0;
      load().catch((error) => banner(`Search failed: ${error.message}`, "bad"));
    });
    older.addEventListener("click", () => { at += 1; load().catch((error) => banner(`Search failed: ${error.message}`, "bad")); });
    newer.addEventListener("click", () => { at = Math.max(0, at - 1); load().catch((error) => banner(`Search failed: ${error.message}`, "bad")); });
    load().catch((error) => banner(`Search failed: ${error.message}`, "bad"));
    return {};
  }

  function runPage() {
    const [, , tenantRaw, ...rest] = location.pathname.split("/");
    const tenant = decodeURIComponent(tenantRaw || "");
    const runId = decodeURIComponent(rest.join("/"));
    async function refresh() {
      const [view, recent] = await Promise.all([
        api(`/api/runs/${encodeURIComponent(tenant)}/${encodeURIComponent(runId)}`),
        api(`/api/recent?${new URLSearchParams({ tenant, run: runId, limit: "50" })}`),
      ]);
      // The live feed's latest progress of each call (the feed keeps the last 500 events):
      // what a running call has said since it started, before its turn is in the history.
      const progress = new Map();
      for (const e of recent.events) if (e.kind === "progress") progress.set(e.call_id, e);
      const ended = new Set(view.turns.flatMap((t) => t.calls.map((c) => c.call_id)));
      const running = [...progress.values()].filter((p) => !ended.has(p.call_id));
      const progressOf = (p) => p ? `${p.done}${p.total ? ` / ${p.total}` : ""}${p.message ? ` · ${p.message}` : ""} (attempt ${p.attempt})` : "";
      const fact = (label, ...value) => [h("dt", {}, label), h("dd", {}, ...value)];
      const secs = (v) => (v === null || v === undefined ? "" : `${Number(v).toFixed(3)} s`);
      const turns = view.turns.map((t) => h("section", { class: "turn", id: `turn-${t.turn_id}` },
        h("h2", {}, `Turn ${t.turn_id} `, badge(`s-${t.status}`, t.status), h("span", { class: "muted" }, ` ${when(t.at)}`)),
        t.error ? h("p", { class: "error" }, `${t.error.type}: ${t.error.message}`) : null,
        h("table", { class: "calls" },
          h("thead", {}, h("tr", {}, ["call", "tool", "status", "effect", "attempts", "took", "progress", "what the model saw", "decision", "tasks", "trace"].map((x) => h("th", {}, x)))),
          h("tbody", {}, t.calls.map((c) => h("tr", { class: "row", dataset: { call: c.call_id, href: callHref(tenant, c.call_id, runId) } },
            h("td", { class: "mono" }, h("a", { href: callHref(tenant, c.call_id, runId) }, c.call_id)),
            h("td", {}, c.version ? `${c.tool}@${c.version}` : c.tool),
            h("td", {}, badge(`s-${c.status}`, c.status)), h("td", {}, badge(`e-${c.effect}`, c.effect)),
            h("td", {}, String(c.attempts || 0)), h("td", {}, secs(c.duration_s)),
            h("td", { class: "progress" }, progressOf(progress.get(c.call_id))),
            h("td", { class: "output" }, c.output === undefined || c.output === null ? h("span", { class: "muted" }, "—") : h("pre", {}, c.output)),
            h("td", {}, c.decision ? `${c.decision.status} by ${c.decision.decided_by || "?"}` : ""),
            h("td", {}, (c.tasks || []).map((x) => h("div", {}, `${x.task_id} (${x.task_kind}, ${x.status})`))),
            h("td", {}, c.trace ? (c.trace.url ? h("a", { href: c.trace.url, target: "_blank", rel: "noopener noreferrer", class: "mono" }, c.trace.id.slice(0, 12)) : h("span", { class: "mono" }, c.trace.id.slice(0, 12))) : ""))))))); 
      const others = [
        ...view.decisions.map((d) => ({ at: d.at, what: `decision: ${d.status} ${(d.calls || []).map((c) => c.call_id).join(", ")}`, by: (d.calls || [])[0] ? d.calls[0].decided_by : "" })),
        ...view.tasks.map((t) => ({ at: t.at, what: `task ${t.task_id || ""}: ${t.task_kind || ""} ${t.status}`, by: "" })),
        ...view.cancellations.map((c) => ({ at: c.at, what: `cancelled: ${c.reason || ""}`, by: (c.calls || [])[0] ? c.calls[0].decided_by : "" })),
      ].sort((a, b) => a.at - b.at);
      main.replaceChildren(...[
        h("p", {}, h("a", { href: "/history" }, "← history"), " · ", h("a", { href: `/history?${new URLSearchParams({ tenant, run: runId })}` }, "this run's entries")),
        h("h1", {}, "run ", h("span", { class: "mono", id: "run-id" }, runId)),
        h("dl", { class: "facts" }, fact("tenant", tenant), fact("turns", String(view.turns.length)),
          fact("recording", view.recording.state)),
        ...(turns.length ? turns : [h("p", { class: "muted" }, "No turn of this run in the history.")]),
        running.length ? h("section", { id: "run-live" }, h("h2", {}, "Running now"),
          h("table", {}, h("thead", {}, h("tr", {}, ["call", "tool", "progress", "at"].map((x) => h("th", {}, x)))),
            h("tbody", {}, running.map((p) => h("tr", { class: "row", dataset: { call: p.call_id, href: callHref(tenant, p.call_id, runId) } },
              h("td", { class: "mono" }, h("a", { href: callHref(tenant, p.call_id, runId) }, p.call_id)), h("td", {}, p.tool_name),
              h("td", { class: "progress" }, progressOf(p)), h("td", { class: "when" }, clock(p.at))))))) : null,
        h("h2", {}, "Decisions, tasks and cancellations"),
        h("table", { id: "run-events" }, h("thead", {}, h("tr", {}, ["time", "what", "by"].map((x) => h("th", {}, x)))),
          h("tbody", {}, others.map((o) => h("tr", {}, h("td", { class: "when" }, when(o.at)), h("td", {}, o.what), h("td", {}, o.by || ""))))),
      ].filter(Boolean));
    }
    refresh().catch((error) => main.replaceChildren(h("h1", {}, "run ", runId), h("p", { class: "error" }, error.message)));
    autoRefresh(refresh);
    return { refresh };
  }

  // --- bulk actions: select, look, confirm, act -----------------------------------------------
  function bulkPage() {
    const params = new URLSearchParams(location.search);
    const field = (name, attrs = {}) => h("input", { name, id: `bulk-${name}`, size: 18, autocomplete: "off", value: params.get(name) || "", ...attrs });
    const action = h("select", { name: "action", id: "bulk-action" },
      [["reject", "reject pending approvals"], ["approve", "approve pending approvals"], ["resolve", "resolve human tasks"], ["assign", "assign human tasks"], ["cancel", "cancel runs"], ["pin", "pin tools where their calls go now"]]
        .map(([value, label]) => h("option", { value, selected: params.get("action") === value }, label)));
    const resolution = h("select", { name: "resolution", id: "bulk-resolution" },
      ["not_applied", "applied", "wrong_effect", "approve_compensation", "reject_compensation"].map((r) => h("option", { value: r }, r)));
    const kind = h("select", { name: "task_kind", id: "bulk-task_kind" }, ["", "unknown_effect", "compensation_approval", "circuit_open"].map((k) => h("option", { value: k }, k || "any kind")));
    const runs = h("textarea", { name: "runs", id: "bulk-runs", rows: 3, cols: 40, placeholder: "one run id per line" }, params.get("runs") || "");
    const form = h("form", { id: "bulk-form", class: "filters" },
      h("label", {}, "action ", action), h("label", { class: "for-calls for-resolve for-assign for-runs" }, "tenant ", field("tenant")), h("label", { class: "for-calls for-resolve for-assign for-tools" }, "tool ", field("tool")),
      h("label", { class: "for-tools" }, h("input", { type: "checkbox", name: "rolled_back", id: "bulk-rolled_back" }), " only those rolled back (a circuit open on a newer version)"),
      h("label", { class: "for-calls for-resolve for-assign" }, "run ", field("run")),
      h("label", { class: "for-resolve for-assign" }, "task kind ", kind), h("label", { class: "for-resolve" }, "resolution ", resolution),
      h("label", { class: "for-resolve" }, "output ", field("output")),
      h("label", { class: "for-assign" }, "assign to ", field("assignee")),
      h("label", { class: "for-runs" }, "runs ", runs),
      h("label", {}, "note ", field("note", { size: 30 })),
      h("button", { type: "submit", id: "bulk-preview" }, "Show what it touches"));
    const plan = h("section", { id: "bulk-plan" });
    main.replaceChildren(h("h1", {}, "Bulk actions"),
      h("p", { class: "muted" }, "Select, look at every target, confirm. Each target is decided as one decision would be, signed for you, and every call it names gets a bulk_action entry in its audit chain."),
      canDecide() ? form : h("p", { id: "bulk-viewer" }, "Bulk actions need the operator role."), plan);
    if (!canDecide()) return {};
    function shown() {
      const a = action.value;
      const kind = (a === "approve" || a === "reject") ? "for-calls" : a === "resolve" ? "for-resolve" : a === "assign" ? "for-assign" : a === "pin" ? "for-tools" : "for-runs";
      for (const el of $$("label.for-calls, label.for-runs, label.for-tools, label.for-resolve, label.for-assign", form)) el.hidden = !el.classList.contains(kind);
    }
    action.addEventListener("change", () => { shown(); plan.replaceChildren(); });
    shown();
    function request() {
      const data = new FormData(form);
      const text = (name) => String(data.get(name) || "").trim() || null;
      const selection = { tenant: action.value === "pin" ? null : text("tenant"), tool: action.value === "cancel" ? null : text("tool") };
      if (action.value === "pin" && data.get("rolled_back") === "on") selection.rolled_back = true;
      const body = { action: action.value, selection, note: text("note") };
      if (action.value === "approve" || action.value === "reject") selection.run = text("run");
      if (action.value === "resolve" || action.value === "assign") {
        selection.run = text("run");
        selection.task_kind = text("task_kind");
      }
      if (action.value === "resolve") {
        body.resolution = text("resolution");
        body.output = text("output");
      }
      if (action.value === "assign") body.assignee = String(data.get("assignee") || "").trim();
      if (action.value === "cancel") selection.runs = String(data.get("runs") || "").split(/\s+/).filter(Boolean);
      for (const [k, v] of Object.entries(selection)) if (v === null) delete selection[k];
      return body;
    }
    const describe = (t) => t.kind === "call" ? `${t.tool} · ${t.tenant_id} / ${t.run_id} / ${t.call_id}`
      : t.kind === "task" ? `${t.task_id} · ${t.tool} · ${t.tenant_id}${t.run_id ? ` / ${t.run_id} / ${t.call_id}` : ` · ${t.calls} calls`}`
      : t.kind === "tool" ? `${t.tool} → version ${t.version}`
      : `${t.tenant_id} / ${t.run_id} · ${t.calls} calls`;
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = request();
      let planned;
      try {
        planned = await post("/api/bulk/plan", body);
      } catch (error) {
        banner(`Nothing to show: ${error.message}`, "bad");
        return;
      }
      banner("", "ok");
      const verb = { approve: "Approve", reject: "Reject", resolve: "Resolve", assign: "Assign", cancel: "Cancel", pin: "Pin" }[planned.action];
      const one = planned.count === 1;
      const noun = planned.action === "cancel" ? (one ? "run" : "runs") : (planned.action === "resolve" || planned.action === "assign") ? (one ? "task" : "tasks") : planned.action === "pin" ? (one ? "tool" : "tools") : (one ? "call" : "calls");
      const table = h("table", { id: "bulk-targets" }, h("thead", {}, h("tr", {}, ["target", "result"].map((t) => h("th", {}, t)))),
        h("tbody", {}, planned.targets.map((t) => h("tr", { class: "row", dataset: { target: t.task_id || t.call_id || t.run_id || t.tool } }, h("td", { class: "mono" }, describe(t)), h("td", { class: "result" }, "")))));
      const confirm = h("button", { type: "button", class: "primary", id: "bulk-confirm", disabled: planned.count === 0 }, `${verb} ${planned.count} ${noun}`);
      const cancel = h("button", { type: "button", onclick: () => plan.replaceChildren() }, "Cancel");
      plan.replaceChildren(
        h("p", { id: "bulk-summary" }, `${planned.count} ${noun} (${planned.calls} call${planned.calls === 1 ? "" : "s"}) would be touched`, planned.count > planned.targets.length ? `; the first ${planned.targets.length} are listed` : "", "."),
        table, h("p", {}, confirm, " ", cancel));
      confirm.focus();
      confirm.addEventListener("click", async () => {
        confirm.disabled = true;
        try {
          const done = await post("/api/bulk/apply", { ...body, digest: planned.digest });
          for (const r of done.results) {
            const row = $(`#bulk-targets tr[data-target="${CSS.escape(r.task_id || r.call_id || r.run_id || r.tool)}"] td.result`);
            if (row) { row.textContent = r.detail; row.className = `result ${r.ok ? "ok" : "error"}`; }
          }
          banner(`${done.bulk_id}: ${done.done} done, ${done.failed} refused.`, done.failed ? "warn" : "ok");
          cancel.textContent = "Close";
        } catch (error) {
          banner(`Not done: ${error.message}`, "bad");
        }
      });
    });
    return {};
  }

  // --- fleet: pools, workers, tenants, limits ------------------------------------------------
  function fleet() {
    const filter = h("input", { "data-filter": true, placeholder: "filter: pool, worker, tenant, tool…", size: 32, autocomplete: "off" });
    const poolsBody = h("tbody", {});
    const workersBody = h("tbody", {});
    const tenantsBody = h("tbody", {});
    const toolsBody = h("tbody", {});
    const defaults = h("p", { class: "muted", id: "tenant-defaults" });
    const table = (id, heads, body) => h("table", { id }, h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))), body);
    const newLimits = h("p", { id: "new-limits" });
    main.replaceChildren(
      h("div", { class: "filters" }, h("label", {}, "filter ", filter)),
      h("h2", {}, "Pools"),
      table("pools", ["pool", "capacity", "running", "saturation", "lag", "workers"], poolsBody),
      h("h2", {}, "Workers"),
      table("workers", ["worker", "pool", "health", "slots", "in flight", "build", "host", "up", "tools"], workersBody),
      h("h2", {}, "Tenants"), defaults,
      table("tenants", ["tenant", "weight", "max concurrency", "rate", "burst", "running", "waiting", "admitted", "share now / by weight", ""], tenantsBody),
      h("h2", {}, "Tool limits"),
      table("tool-limits", ["tool", "max concurrency", "rate", "burst", "rate per tenant", "burst per tenant", ""], toolsBody),
      newLimits);
    filter.addEventListener("input", () => { for (const row of $$("tr.row", main)) row.hidden = !row.textContent.toLowerCase().includes(filter.value.trim().toLowerCase()); });
    let actions = false;
    const fleetWide = (label, onclick, extra = {}) => actions ? decisionButton(label, onclick, extra) : null;
    const num = (v, unit = "") => (v === undefined || v === null ? "—" : `${Number(v.toPrecision(4))}${unit}`);
    const pct = (v) => (v === undefined || v === null ? "—" : `${Math.round(v * 100)}%`);
    function meter(value, label) {
      const fill = h("span", {});
      fill.style.width = `${Math.max(0, Math.min(1, value || 0)) * 100}%`; // CSSOM: allowed by the CSP
      return h("span", { class: "meter", title: label, role: "img", "aria-label": label }, fill);
    }
    const FIELDS = {
      tenants: [["max_concurrency", "max concurrency", "1"], ["weight", "weight", "any"], ["rate", "rate (calls/s)", "any"], ["burst", "burst", "1"]],
      tools: [["max_concurrency", "max concurrency", "1"], ["rate", "rate (calls/s)", "any"], ["burst", "burst", "1"], ["tenant_rate", "rate per tenant", "any"], ["tenant_burst", "burst per tenant", "1"]],
    };
    // Limits of a tenant or a tool: what is left empty keeps its value; "clear" starts over.
    function limitsForm(row, colspan, kind, name, current) {
      decisionForm(row, colspan, () => withLabel([
        ...(name === null ? [h("label", {}, `${kind === "tenants" ? "tenant" : "tool"} `, h("input", { name: "name", required: true, size: 16, autocomplete: "off" }))] : [h("span", {}, `Limits of ${name}: `)]),
        ...FIELDS[kind].map(([key, label, step]) => h("label", {}, `${label} `, h("input", { name: key, type: "number", min: step === "1" ? "1" : "0", step, size: 6, placeholder: current[key] === undefined ? "off" : String(current[key]) }))),
        h("label", {}, h("input", { type: "checkbox", name: "clear" }), " clear the others"),
      ], "Confirm limits"), async (data) => {
        const target = name === null ? String(data.get("name") || "").trim() : name;
        const body = { clear: data.get("clear") === "on" };
        for (const [key, , step] of FIELDS[kind]) {
          const raw = String(data.get(key) || "").trim();
          if (raw) body[key] = step === "1" ? parseInt(raw, 10) : parseFloat(raw);
        }
        const done = await post(`/api/limits/${kind}/${encodeURIComponent(target)}`, body);
        const set = Object.entries(done.limits).map(([k, v]) => `${k}=${v}`).join(" ") || "no limits";
        return `${target}: ${set}.`;
      });
    }

    async function refresh() {
      const [pools, tenants] = await Promise.all([api("/api/pools"), api("/api/tenants")]);
      if (formOpen()) return; // an operator is deciding: leave the rows as they are
      actions = tenants.actions;
      const keep = state.selected && state.selected.id;
      poolsBody.replaceChildren(...pools.pools.map((p) => h("tr", { class: "row", id: `pool-${p.name}`, dataset: { kind: "pool" } },
        h("td", {}, p.name), h("td", {}, String(p.capacity)), h("td", {}, String(p.running)),
        h("td", {}, meter(p.saturation, `${pct(p.saturation)} of its slots`), " ", pct(p.saturation)),
        h("td", {}, p.lag === null ? h("span", { class: "muted" }, "unknown") : String(p.lag)),
        h("td", {}, `${p.workers.filter((w) => w.live).length} live of ${p.workers.length}`))));
      if (!pools.pools.length) poolsBody.append(h("tr", { class: "empty" }, h("td", { colspan: 6 }, "No worker has registered.")));
      workersBody.replaceChildren(...pools.pools.flatMap((p) => p.workers.map((w) => h("tr", { class: "row", id: `worker-${w.worker_id}`, dataset: { kind: "worker" } },
        h("td", { class: "mono" }, w.worker_id), h("td", {}, p.name),
        h("td", {}, w.live ? badge("c-closed", "live") : badge("c-open", `silent since ${clock(w.registered_until)}`)),
        h("td", {}, String(w.slots)), h("td", {}, w.in_flight === null ? "—" : String(w.in_flight)),
        h("td", { class: "mono" }, w.build || "—"), h("td", {}, w.host || "—"),
        h("td", {}, w.started_at ? age(pools.now - w.started_at) : "—"),
        h("td", { class: "mono" }, Object.entries(w.tools).map(([n, v]) => `${n}@${v}`).join(" "))))));
      if (!workersBody.children.length) workersBody.append(h("tr", { class: "empty" }, h("td", { colspan: 9 }, "No worker has registered.")));
      const d = tenants.defaults;
      defaults.textContent = `Tenants nobody configured: ${Object.entries(d).map(([k, v]) => `${k}=${v}`).join(", ") || "no limits, weight 1"}.`;
      tenantsBody.replaceChildren(...tenants.tenants.map((t) => {
        const row = h("tr", { class: "row", id: `tenant-${t.tenant_id}`, dataset: { kind: "tenant", tenant: t.tenant_id } },
          h("td", {}, t.tenant_id), h("td", {}, num(t.weight)), h("td", {}, num(t.limits.max_concurrency)),
          h("td", {}, num(t.limits.rate, "/s")), h("td", {}, num(t.limits.burst)),
          h("td", {}, String(t.running)), h("td", {}, String(t.waiting)), h("td", {}, String(t.admitted_total)),
          h("td", { class: "share" }, meter(t.share, `${pct(t.share)} of running calls`), ` ${pct(t.share)} / ${pct(t.fair_share)}`),
          h("td", { class: "actions" }, fleetWide("Limits…", () => limitsForm(row, 10, "tenants", t.tenant_id, t.limits))));
        return row;
      }));
      if (!tenants.tenants.length) tenantsBody.append(h("tr", { class: "empty" }, h("td", { colspan: 10 }, "No tenant is configured or busy.")));
      toolsBody.replaceChildren(...tenants.tools.map((t) => {
        const l = t.limits;
        const row = h("tr", { class: "row", id: `limits-${t.name}`, dataset: { kind: "tool-limits" } },
          h("td", {}, t.name), h("td", {}, num(l.max_concurrency)), h("td", {}, num(l.rate, "/s")), h("td", {}, num(l.burst)),
          h("td", {}, num(l.tenant_rate, "/s")), h("td", {}, num(l.tenant_burst)),
          h("td", { class: "actions" }, fleetWide("Limits…", () => limitsForm(row, 7, "tools", t.name, l))));
        return row;
      }));
      if (!tenants.tools.length) toolsBody.append(h("tr", { class: "empty" }, h("td", { colspan: 7 }, "No tool has limits.")));
      newLimits.replaceChildren(
        fleetWide("Limit a tenant…", () => limitsForm(tenantsBody.lastElementChild, 10, "tenants", null, {}), { id: "limit-tenant" }) || "",
        " ",
        fleetWide("Limit a tool…", () => limitsForm(toolsBody.lastElementChild, 7, "tools", null, {}), { id: "limit-tool" }) || "");
      select(keep ? document.getElementById(keep) : null);
    }
    refresh().catch((error) => banner(`Could not load: ${error.message}`, "bad"));
    autoRefresh(refresh);
    return { refresh };
  }

  // --- one call ------------------------------------------------------------------------------
  function callPage() {
    const [, , tenantRaw, ...rest] = location.pathname.split("/");
    const tenant = decodeURIComponent(tenantRaw || "");
    const callId = decodeURIComponent(rest.join("/"));
    const run = new URLSearchParams(location.search).get("run") || "";

    async function refresh() {
      const view = await api(`/api/calls/${encodeURIComponent(tenant)}/${encodeURIComponent(callId)}?run=${encodeURIComponent(run)}`);
      const e = view.entry;
      const fact = (label, ...value) => [h("dt", {}, label), h("dd", {}, ...value)];
      const trace = view.trace
        ? (view.trace.url ? h("a", { href: view.trace.url, target: "_blank", rel: "noopener noreferrer", class: "mono", id: "trace-link" }, view.trace.id) : h("span", { class: "mono", id: "trace-id" }, view.trace.id))
        : h("span", { class: "muted" }, "none recorded");
      const facts = h("dl", { class: "facts", id: "entry" },
        fact("tenant", e.tenant_id), fact("run", h("span", { class: "mono" }, e.run_id)), fact("turn", String(e.turn_id)),
        fact("tool", e.tool_version ? `${e.tool_name}@${e.tool_version}` : e.tool_name), fact("pool", e.pool || ""),
        fact("state", badge(`s-${e.state}`, e.state)), fact("attempts", String(e.attempts)), fact("fencing token", String(e.fencing_token)),
        fact("idempotency key", h("span", { class: "mono" }, e.idempotency_key)),
        fact("arguments sha256", h("span", { class: "mono", id: "arguments-digest" }, e.arguments_digest), h("span", { class: "muted" }, ` (${e.arguments_bytes} bytes; values are not shown)`)),
        fact("upstream reference", view.upstream_ref ? h("span", { class: "mono", id: "upstream-ref" }, view.upstream_ref) : h("span", { class: "muted" }, "none recorded")),
        fact("approval", e.approval || (e.pending_approval ? "pending" : "not asked")),
        fact("worker", e.worker_id || ""), fact("lease until", e.lease_until ? clock(e.lease_until) : ""),
        fact("trace", trace));
      const o = view.outcome;
      const outcome = o ? h("dl", { class: "facts", id: "outcome" },
        fact("status", badge(`s-${o.status}`, o.status)), fact("effect", badge(`e-${o.effect}`, o.effect)),
        fact("source", o.source || ""), fact("attempt", String(o.attempt)),
        o.output !== undefined ? fact("output (what the model sees)", h("pre", {}, o.output)) : [],
        o.error ? fact("error", h("span", { class: "error" }, `${o.error.type}: ${o.error.message}`)) : [])
        : h("p", { class: "muted" }, "No outcome yet.");
      const audit = h("table", { id: "audit" },
        h("thead", {}, h("tr", {}, ["time", "event", "details"].map((t) => h("th", {}, t)))),
        h("tbody", {}, view.audit.map((ev) => {
          const { event, at, ...details } = ev;
          return h("tr", { class: "row", dataset: { event } }, h("td", { class: "when" }, clock(at)), h("td", {}, event),
            h("td", { class: "mono" }, Object.keys(details).length ? JSON.stringify(details) : ""));
        })));
      // Every failed attempt with its traceback, the latest (or the one the URL names) open.
      const failures = view.failures || [];
      const named = location.hash.startsWith("#attempt-") ? location.hash.slice(1) : null;
      const failure = failures.length ? h("div", { id: "failure" }, failures.map((f, i) => {
        const latest = i === failures.length - 1;
        const id = `attempt-${f.attempt}`;
        return h("details", { id, class: "failure", open: named ? named === id : latest },
          h("summary", {}, `attempt ${f.attempt}: `, h("span", { class: "error" }, `${f.type}: ${f.message}`),
            h("span", { class: "muted" }, ` · ${f.worker_id || "?"} · ${f.at ? clock(f.at) : ""}`)),
          h("pre", { class: "traceback", id: latest ? "failure-traceback" : null }, f.traceback));
      })) : null;
      const waiting = e.pending_approval && !e.approval
        ? h("p", { class: "s-pending_approval" }, "This call waits for approval: ", h("a", { href: `/tasks#approval-${e.tenant_id}-${e.call_id}` }, "decide it on the tasks page"), ".")
        : null;
      main.replaceChildren(...[
        h("p", {}, h("a", { href: "/" }, "← live"), " · ", h("a", { href: "/tasks" }, "tasks & approvals")),
        h("h1", {}, "call ", h("span", { class: "mono" }, e.call_id)),
        waiting, facts, h("h2", {}, "Outcome"), outcome,
        failure ? h("h2", {}, failures.length > 1 ? `What the tool raised (${failures.length} failed attempts)` : "What the tool raised") : null, failure,
        h("h2", {}, "Audit chain"), audit,
      ].filter(Boolean));
    }
    refresh().catch((error) => { main.replaceChildren(h("h1", {}, "call ", callId), h("p", { class: "error" }, error.message)); });
    return { refresh };
  }

  // --- start ---------------------------------------------------------------------------------
  async function start() {
    try {
      state.config = await api("/api/config");
    } catch (error) {
      banner(`The console does not answer: ${error.message}`, "bad");
      return;
    }
    const c = state.config;
    setFeed(c.feed);
    const op = $("#operator");
    op.textContent = `${c.operator} · ${c.role}`;
    op.dataset.role = c.role;
    op.title = `signed in as ${c.operator} (${c.role}); tenants: ${c.tenants ? c.tenants.join(", ") || "none" : "every tenant"}`;
    if (c.session) {
      const out = $("#logout");
      out.hidden = false;
      out.addEventListener("click", async () => {
        try {
          const done = await api("/auth/logout", { method: "POST" });
          location.href = done.redirect;
        } catch (error) {
          banner(`Not signed out: ${error.message}`, "bad");
        }
      });
    }
    if (c.tenant) {
      const scope = $("#scope");
      scope.textContent = `tenant: ${c.tenant} only`;
      scope.hidden = false;
    }
    const path = location.pathname;
    const page = path === "/" ? "live" : path === "/tasks" ? "tasks" : path === "/circuits" ? "circuits" : path === "/fleet" ? "fleet" : path === "/bulk" ? "bulk" : path === "/overview" ? "overview" : path === "/history" ? "history" : path.startsWith("/runs/") ? "run" : path.startsWith("/calls/") ? "call" : null;
    for (const link of $$("nav a")) if (link.dataset.nav === page) link.setAttribute("aria-current", "page");
    if (page === "live") state.view = live();
    else if (page === "tasks") state.view = tasks();
    else if (page === "circuits") state.view = circuits();
    else if (page === "fleet") state.view = fleet();
    else if (page === "bulk") state.view = bulkPage();
    else if (page === "history") state.view = historyPage();
    else if (page === "overview") state.view = overviewPage();
    else if (page === "run") state.view = runPage();
    else if (page === "call") state.view = callPage();
    else main.replaceChildren(h("p", {}, "No such page. ", h("a", { href: "/" }, "Live")));
    document.body.dataset.ready = page || "none";
    if (page !== "live") {
      // Only the live page holds a stream; the others show the feed's state as of loading.
      setFeed(c.feed);
    }
  }
  start();
})();
