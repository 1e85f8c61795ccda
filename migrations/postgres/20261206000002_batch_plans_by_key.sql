-- Issue 21: group commit's two batch functions plan once per connection (plan_cache_mode =
-- force_generic_plan), and that one plan was made from whatever the table looked like at the
-- connection's first batch. On a new table (an empty one that ANALYZE has not seen yet) the
-- planner judged a sequential scan cheapest, and the connection kept it until ANALYZE
-- invalidated it: autovacuum gets there within a minute or so, and until then every batch read
-- the whole table (a fresh database, 16 callers for 8 s: 2,668 sequential scans reading 7.9M
-- rows for 5,800 charges; BENCHMARKS.md, "Group commit", ninth round).
--
-- Both functions find at most batch_max rows by a unique key (the primary key; the operation
-- key), so a nested loop over index scans is the right plan at any size of the table. These
-- settings hold only while each function runs, and leave it nothing else to choose.
ALTER FUNCTION insert_pending_first_attempts SET enable_seqscan = off;
ALTER FUNCTION insert_pending_first_attempts SET enable_hashjoin = off;
ALTER FUNCTION insert_pending_first_attempts SET enable_mergejoin = off;
ALTER FUNCTION finish_rounds SET enable_seqscan = off;
ALTER FUNCTION finish_rounds SET enable_hashjoin = off;
ALTER FUNCTION finish_rounds SET enable_mergejoin = off;
