"""The klwatch Streamlit dashboard (``klwatch dashboard`` / ``streamlit run dashboard/app.py``).

``app`` is the page; ``data`` the cached calls into ``klwatch.pipeline``; ``charts`` the figures.
"""
