"""The browser environment: Playwright driving the system Chromium over MiniWoB++ or any site.

`env.py` (the environment, `BrowserEnv`), `chromium.py` (finding and sharing the browser),
`page.py` (element ids and the accessibility tree), `actions.py` (the tools), `miniwob.py` and
`sites.py` (task sources and their rewards), `solvers.py` (scripted MiniWoB solutions),
`server.py` (local static servers). Nothing is imported here, so the task sources load without
Playwright.
"""
