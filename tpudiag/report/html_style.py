"""The HTML report's style sheet (`report/html.py` inlines it in every page: the page fetches nothing)."""

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto; max-width: 1180px;
       color: #1d1d1f; background: #fff; font-size: 14px; line-height: 1.4; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 6px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ddd;
       padding-bottom: 4px; } h3 { font-size: 15px; margin: 16px 0 6px; }
code, .mono, td.num { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 13px; }
.muted { color: #6b6b6b; } .ok { color: #1b7f3b; font-weight: 600; } .bad { color: #b3261e; font-weight: 600; }
.meta { color: #333; margin: 2px 0; }
ul.warn { background: #fff7e0; border: 1px solid #f0d48a; padding: 8px 8px 8px 28px; margin: 10px 0; }
table { border-collapse: collapse; margin: 6px 0 10px; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eee; text-align: left; vertical-align: middle; }
th { background: #f5f5f7; font-weight: 600; } td.num, th.num { text-align: right; white-space: nowrap; }
td.name { max-width: 360px; overflow-wrap: anywhere; }
svg { display: block; max-width: 100%; height: auto; margin: 6px 0; }
svg text { font-family: system-ui, sans-serif; font-size: 12px; fill: #1d1d1f; }
.legend span.item { white-space: nowrap; margin-right: 14px; }
.legend span.sw { display: inline-block; width: 11px; height: 11px; margin: 0 5px -1px 0; border-radius: 2px; }
.note { background: #f2f6fc; border-left: 4px solid #3b6fd6; padding: 8px 12px; margin: 8px 0; }
"""
