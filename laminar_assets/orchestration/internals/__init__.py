"""Where Laminar follows Dagster's internals (pinned to Dagster 1.13): the thread executor, the instance
class, executing run requests in this process."""
