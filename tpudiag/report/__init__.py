"""Report: renderers (terminal, Markdown, JSON, HTML, JUnit, Perfetto) behind one registry
(`registry.py`, schema kind x format). They format figures; they never compute one."""
