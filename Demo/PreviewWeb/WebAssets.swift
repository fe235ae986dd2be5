/// The page, its script and its style: static text served from memory (no files to install). The
/// script builds everything with `textContent` and attributes, never `innerHTML`: a file's name
/// or pusher is text on the page, whatever it contains.
enum WebAssets {
    static let page = """
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>Preview</title>
        <link rel="stylesheet" href="app.css">
        <script src="app.js" defer></script>
        </head>
        <body>
        <header>
          <h1 id="title">Preview</h1>
          <span id="status" class="status" data-state="connecting">connecting…</span>
        </header>
        <main>
          <section id="viewer" aria-live="polite">
            <p class="empty">Nothing here yet. Push a file with <code>preview-push FILE</code> and it shows here at once.</p>
          </section>
          <aside>
            <h2>Files <span id="count"></span></h2>
            <ul id="files"></ul>
          </aside>
        </main>
        </body>
        </html>
        """

    static let style = """
        :root { color-scheme: light dark; --line: #d0d0d7; --muted: #6b6b75; --accent: #0a64d8; --card: #f6f6f8; }
        @media (prefers-color-scheme: dark) { :root { --line: #3a3a42; --muted: #a0a0aa; --accent: #5ea2ff; --card: #1f1f24; } }
        * { box-sizing: border-box; }
        body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
        header { display: flex; align-items: center; gap: .75rem; padding: .6rem 1rem; border-bottom: 1px solid var(--line); }
        h1 { font-size: 1.15rem; margin: 0; overflow-wrap: anywhere; }
        h2 { font-size: 1rem; margin: 0 0 .5rem; }
        .status { margin-left: auto; font-size: .8rem; color: var(--muted); white-space: nowrap; }
        .status[data-state="live"]::before { content: "●"; color: #1a9b3c; margin-right: .3rem; }
        main { display: flex; gap: 1rem; padding: 1rem; align-items: flex-start; }
        #viewer { flex: 3; min-width: 0; }
        aside { flex: 1; min-width: 16rem; max-width: 26rem; }
        .viewer-head { display: flex; flex-wrap: wrap; align-items: baseline; gap: .25rem .75rem; margin-bottom: .5rem; }
        .viewer-head h2 { font-size: 1.1rem; margin: 0; overflow-wrap: anywhere; }
        .meta { color: var(--muted); font-size: .85rem; }
        #document { display: block; max-width: 100%; border: 1px solid var(--line); border-radius: 6px; background: #fff; }
        img#document { max-height: 78vh; height: auto; }
        iframe#document { width: 100%; height: 78vh; }
        p#document { padding: 1rem; background: var(--card); }
        ul#files { list-style: none; margin: 0; padding: 0; }
        ul#files li button { all: unset; box-sizing: border-box; display: block; width: 100%; padding: .45rem .6rem; border-radius: 6px; cursor: pointer; }
        ul#files li button:hover, ul#files li button:focus-visible { background: var(--card); }
        ul#files li[aria-current="true"] button { outline: 2px solid var(--accent); }
        .file-name { display: block; font-weight: 600; overflow-wrap: anywhere; }
        .empty { color: var(--muted); }
        a { color: var(--accent); }
        @media (max-width: 700px) {
          main { flex-direction: column; padding: .6rem; }
          aside { max-width: none; width: 100%; min-width: 0; }
          img#document { max-height: 60vh; }
          iframe#document { height: 60vh; }
        }
        """

    static let script = """
        'use strict';
        // The live page: the newest file large, the list beside it (below it on a narrow screen), a
        // new push shown at once from /events. Names are text: textContent, never innerHTML.
        const state = { files: [], selected: null, allowScripts: false };
        // When each file's event arrived and when it was visible (Date.now()): read by the tests and
        // the D2 benchmark, in the page.
        window.previewArrivals = {};
        window.previewVisible = {};

        function element(tag, className, text) {
          const node = document.createElement(tag);
          if (className) node.className = className;
          if (text !== undefined) node.textContent = text;
          return node;
        }
        function size(bytes) {
          const units = ['bytes', 'kB', 'MB', 'GB', 'TB'];
          let value = bytes, unit = 0;
          while (value >= 1000 && unit < units.length - 1) { value /= 1000; unit++; }
          return (unit === 0 ? value : value.toFixed(value < 10 ? 1 : 0)) + ' ' + units[unit];
        }
        function when(ms) { return new Date(ms).toLocaleString(); }
        function fileURL(name) { return 'files/' + encodeURIComponent(name); }
        function who(entry) { return entry.pusher ? entry.pusher + (entry.pusherKey ? ' (' + entry.pusherKey + ')' : '') : 'in the folder'; }

        function show(entry) {
          const viewer = document.getElementById('viewer');
          const head = element('div', 'viewer-head');
          head.append(element('h2', 'document-name', entry.display),
                      element('span', 'meta', size(entry.size) + ' · ' + who(entry) + ' · ' + when(entry.time)));
          const open = element('a', 'meta', 'open');
          open.href = fileURL(entry.name);
          open.target = '_blank';
          open.rel = 'noopener';
          head.append(open);
          let body;
          const visible = () => { window.previewVisible[entry.name] = Date.now(); };
          switch (entry.kind) {
            case 'image':
              body = element('img');
              body.alt = entry.display;
              body.addEventListener('load', visible, { once: true });
              body.src = fileURL(entry.name);
              break;
            case 'pdf':
              body = element('iframe');
              body.title = entry.display;
              body.addEventListener('load', visible, { once: true });
              body.src = fileURL(entry.name);
              break;
            case 'markdown':
            case 'text':
            case 'html':
              body = element('iframe');
              body.title = entry.display;
              // No same origin, no scripts (unless the server was started with --allow-scripts,
              // for HTML), no forms, no popups: what was pushed cannot touch this page.
              body.setAttribute('sandbox', entry.kind === 'html' && state.allowScripts ? 'allow-scripts' : '');
              body.addEventListener('load', visible, { once: true });
              body.src = entry.kind === 'html' ? fileURL(entry.name) : 'render/' + encodeURIComponent(entry.name);
              break;
            default:
              body = element('p');
              const link = element('a', null, 'Download ' + entry.display);
              link.href = fileURL(entry.name);
              link.setAttribute('download', entry.name);
              body.append(link, document.createTextNode(' (' + entry.type + ', ' + size(entry.size) + ')'));
              visible();
          }
          body.id = 'document';
          body.dataset.name = entry.name;
          viewer.replaceChildren(head, body);
          state.selected = entry.name;
          for (const item of document.querySelectorAll('#files li')) {
            item.setAttribute('aria-current', item.dataset.name === entry.name ? 'true' : 'false');
          }
        }

        function listItem(entry) {
          const item = element('li');
          item.dataset.name = entry.name;
          item.setAttribute('aria-current', entry.name === state.selected ? 'true' : 'false');
          const button = element('button');
          button.type = 'button';
          button.append(element('span', 'file-name', entry.display),
                        element('span', 'meta', size(entry.size) + ' · ' + who(entry) + ' · ' + when(entry.time)));
          button.addEventListener('click', () => show(entry));
          item.append(button);
          return item;
        }

        function renderList() {
          document.getElementById('files').replaceChildren(...state.files.map(listItem));
          document.getElementById('count').textContent = '(' + state.files.length + ')';
        }

        function merge(entries) {
          const seen = new Set();
          state.files = entries.concat(state.files).filter(entry => !seen.has(entry.name) && seen.add(entry.name))
            .sort((a, b) => b.time - a.time);
        }

        function setStatus(text, which) {
          const status = document.getElementById('status');
          status.textContent = text;
          status.dataset.state = which;
        }

        function watch() {
          const source = new EventSource('events');
          let opened = 0;
          source.addEventListener('open', () => {
            setStatus('live', 'live');
            // Back after a lost stream (the server restarted, the network dropped): what was
            // pushed meanwhile is in the list, not in an event.
            if (opened++ > 0) load().catch(() => {});
          });
          source.addEventListener('error', () => setStatus('reconnecting…', 'reconnecting'));
          source.addEventListener('stored', event => {
            const entry = JSON.parse(event.data);
            window.previewArrivals[entry.name] = Date.now();
            merge([entry]);
            renderList();
            show(entry);
          });
        }

        async function load() {
          const response = await fetch('api/files', { cache: 'no-store' });
          const listing = await response.json();
          state.allowScripts = listing.allowScripts;
          document.title = listing.name;
          document.getElementById('title').textContent = listing.name;
          const hadNone = state.files.length === 0;
          merge(listing.files);
          renderList();
          if (hadNone && state.files.length > 0) show(state.files[0]);
        }

        // Watch first, then list: a push between the two is in one or the other, never lost.
        watch();
        load().catch(error => setStatus('cannot list the files: ' + error, 'error'));
        """
}
