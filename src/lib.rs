//! chargeguard: a payment side-effect orchestrator. Consumers call it before charging; it keeps
//! a durable record of intent, derives the provider idempotency key from the business operation,
//! and owns the recovery of every attempt whose outcome is unknown. See ARCHITECTURE.md.

pub mod bench;
pub mod cli;
pub mod clock;
pub mod config;
pub mod domain;
pub mod embedded;
pub mod failpoints;
pub mod finance;
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc;
pub mod http;
pub mod orchestrator;
pub mod provider;
pub mod report;
pub mod secret;
pub mod simulator;
pub mod startup;
pub mod store;
pub mod sweep_job;
pub mod telemetry;
pub mod tls;
pub mod webhook;
