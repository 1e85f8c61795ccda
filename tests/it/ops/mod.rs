//! Operating chargeguard: the first run, the CLI client, health and reflection, graceful
//! shutdown, metrics, the alerting rules and the dashboard, logs, configuration and deploy/ (issue 7).

pub(crate) mod process;

mod alerts;
mod cli;
mod config;
mod dashboard;
mod deploy;
mod first_run;
mod health;
mod logs;
mod metrics;
mod quickstart;
mod shutdown;
