"""A shared stage's pass: its rows and dedup against the rows kept (`dedup`), the job (`job`), and its
commit with exact change data for refilled partitions (`commit`)."""
