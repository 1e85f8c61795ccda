//! Operating chargeguard: the first run, the CLI client, health and reflection, graceful
//! shutdown, metrics and the alerting rules, logs, configuration and deploy/ (issue 7).

pub(crate) mod process;

mod alerts;
mod cli;
mod config;
mod deploy;
mod first_run;
mod health;
mod logs;
mod metrics;
mod quickstart;
mod shutdown;
