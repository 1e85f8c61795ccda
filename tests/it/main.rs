//! The one integration-test binary: every test drives the real servers over real sockets
//! against a real PostgreSQL database and the in-process Stripe simulator.

mod support;

mod bench;
mod charge;
mod insert_race;
mod simulator;
mod store_pool;
