-- What chargeguard runs against PostgreSQL to answer a duplicate: find_by_operation
-- (src/store/postgres.rs), on rows `chargeguard bench seed` made (operation keys 1..:rows).
\set key random(1, :rows)
SELECT * FROM payment_attempts WHERE consumer = :consumer AND operation_key = :key;
