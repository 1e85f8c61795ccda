//! The whole chain the way a user runs it: real processes on 127.0.0.1 — the simulator, three
//! `serve` replicas behind pgbouncer on a private PostgreSQL cluster, the example consumer
//! (`examples/order-consumer`) on a real broker — and failures made by killing them.

mod chaos;
mod nats;
mod rig;
