"""A flow's pass: one SQL statement of rows, window copies, partial states and merge (`query`), its
state table (`state`), run metrics (`metrics`), and the job that writes and commits state and sink (`job`)."""
