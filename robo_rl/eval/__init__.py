"""Success metrics, reports, plots and videos."""
