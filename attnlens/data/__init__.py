"""Text and positions: corpora packed into blocks of exactly n tokens, the position classes
(self, prev, next, band(w), cls, sep, punct, other) of an attention matrix, and labelled tasks."""
