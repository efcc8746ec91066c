"""The klwatch Streamlit dashboard (``klwatch dashboard`` / ``streamlit run dashboard/app.py``).

``app`` is the page; ``data`` the cached calls into ``detectors.pipeline``; ``charts`` the figures.
"""
