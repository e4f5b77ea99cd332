"""Report: renderers (terminal, JSON, Markdown). They format figures; they never compute one."""
