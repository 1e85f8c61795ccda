//! Operating chargeguard: the first run, the CLI client, health and reflection, graceful
//! shutdown, metrics, logs, configuration and deploy/ (issue 7).

pub(crate) mod process;

mod cli;
mod config;
mod deploy;
mod first_run;
mod health;
mod logs;
mod metrics;
mod quickstart;
mod shutdown;
