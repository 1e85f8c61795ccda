//! The one integration-test binary: every test drives the real servers over real sockets
//! against a real database (PostgreSQL, or the embedded SQLite file where a test says so) and
//! the in-process Stripe simulator.

mod support;

mod attempt_numbers;
mod bench;
mod e2e;
mod charge;
mod client;
mod embedded;
mod finance;
mod group_commit;
mod group_commit_finish;
mod insert_race;
mod migrations;
mod model;
mod outcome_cache;
mod ops;
mod provider;
mod recovery;
mod refunds;
mod security;
mod reports;
mod reports_refunds;
mod simulator;
mod store;
mod store_pool;
mod webhooks;
mod webhooks_refunds;
