//! `chargeguard stripe-sim`: the simulator as a standalone process.

use std::net::SocketAddr;

use super::{DEFAULT_API_KEY, SimulatorConfig, SimulatorLimits, WebhookTarget};

#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(
        long,
        default_value = "127.0.0.1:12111",
        env = "CHARGEGUARD_SIM_LISTEN"
    )]
    pub listen: SocketAddr,
    /// Accepted secret key (repeatable).
    #[arg(long = "api-key", default_values_t = [DEFAULT_API_KEY.to_owned()])]
    pub api_keys: Vec<String>,
    /// Where to deliver webhook events.
    #[arg(long, requires = "webhook_secret")]
    pub webhook_url: Option<String>,
    /// Signing secret of the webhook endpoint (whsec_…).
    #[arg(
        long,
        requires = "webhook_url",
        env = "CHARGEGUARD_SIM_WEBHOOK_SECRET",
        hide_env_values = true
    )]
    pub webhook_secret: Option<String>,
    /// Seconds before a change shows in search results.
    #[arg(long, default_value_t = SimulatorConfig::default().search_lag_seconds)]
    pub search_lag_seconds: u64,
    /// Seconds (sim clock) before a processing payment settles.
    #[arg(long, default_value_t = SimulatorConfig::default().settlement_delay_seconds)]
    pub settlement_delay_seconds: u64,
    /// Seed of ids, probabilistic faults and shuffled webhooks.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Most payment intents plus refunds kept.
    #[arg(long, default_value_t = SimulatorLimits::default().objects_max)]
    pub objects_max: usize,
    /// Most idempotency keys kept.
    #[arg(long, default_value_t = SimulatorLimits::default().idempotency_keys_max)]
    pub idempotency_keys_max: usize,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = SimulatorLimits::default().body_bytes_max)]
    pub body_bytes_max: usize,
    /// Most concurrent connections.
    #[arg(long, default_value_t = SimulatorLimits::default().connections_max)]
    pub connections_max: usize,
    /// Most queued webhook deliveries.
    #[arg(long, default_value_t = SimulatorLimits::default().webhook_queue_max)]
    pub webhook_queue_max: usize,
}

impl SimArgs {
    pub fn config(&self) -> SimulatorConfig {
        let defaults = SimulatorConfig::default();
        SimulatorConfig {
            api_keys: self.api_keys.clone(),
            webhook: self
                .webhook_url
                .clone()
                .zip(self.webhook_secret.clone())
                .map(|(url, secret)| WebhookTarget { url, secret }),
            search_lag_seconds: self.search_lag_seconds,
            settlement_delay_seconds: self.settlement_delay_seconds,
            seed: self.seed,
            limits: SimulatorLimits {
                objects_max: self.objects_max,
                idempotency_keys_max: self.idempotency_keys_max,
                body_bytes_max: self.body_bytes_max,
                connections_max: self.connections_max,
                webhook_queue_max: self.webhook_queue_max,
                ..defaults.limits
            },
            ..defaults
        }
    }
}

/// Serves until SIGINT or SIGTERM.
pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let handle = super::spawn(args.config(), listener).await?;
    tracing::info!(base_url = %handle.base_url(), "stripe simulator ready");
    wait_for_signal().await?;
    tracing::info!("stripe simulator shutting down");
    handle.shutdown().await;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            result = tokio::signal::ctrl_c() => result?,
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    #[test]
    fn flags_parse_into_a_config() {
        Cli::command().debug_assert();
        let defaults = Cli::try_parse_from(["stripe-sim"]).unwrap().sim;
        assert_eq!(defaults.listen.to_string(), "127.0.0.1:12111");
        assert_eq!(defaults.config().api_keys, [DEFAULT_API_KEY]);
        let cli = Cli::try_parse_from([
            "stripe-sim",
            "--api-key",
            "sk_test_a",
            "--api-key",
            "sk_test_b",
            "--webhook-url",
            "http://127.0.0.1:9/hook",
            "--webhook-secret",
            "whsec_x",
            "--objects-max",
            "7",
        ])
        .unwrap();
        let config = cli.sim.config();
        assert_eq!(config.api_keys, ["sk_test_a", "sk_test_b"]);
        assert_eq!(
            config.webhook.map(|target| target.secret),
            Some("whsec_x".to_owned())
        );
        assert_eq!(config.limits.objects_max, 7);
        assert!(Cli::try_parse_from(["stripe-sim", "--webhook-url", "http://x"]).is_err());
    }
}
