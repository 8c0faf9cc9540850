"""Models: loading any Hugging Face model or an offline alias (converted once and cached), and
capture, the one place that reads and changes attention."""
