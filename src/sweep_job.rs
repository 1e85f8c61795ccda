//! The sweep on a schedule inside `serve` (tokio-cron-scheduler, 6-field cron, UTC). In one
//! process passes never overlap: a tick that finds the previous pass still running does nothing.
//! Replicas may sweep at the same time; the row leases keep that safe.

use std::sync::Arc;

use anyhow::Context;
use tokio::sync::Mutex;
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;

use crate::orchestrator::Orchestrator;

/// Whether `schedule` is a cron expression the scheduler accepts (seconds first).
pub fn schedule_is_valid(schedule: &str) -> bool {
    Job::new_async(schedule, |_, _| Box::pin(async {})).is_ok()
}

pub struct SweepJob {
    scheduler: JobScheduler,
    /// Held by the pass in progress.
    pass: Arc<Mutex<()>>,
}

impl SweepJob {
    /// Starts ticking. Once `shutdown` fires, a pass in progress stops between rows.
    pub async fn start(
        orchestrator: Orchestrator,
        schedule: &str,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let pass = Arc::new(Mutex::new(()));
        let job = Job::new_async(schedule, {
            let pass = pass.clone();
            move |_job_id, _scheduler| {
                let orchestrator = orchestrator.clone();
                let pass = pass.clone();
                let shutdown = shutdown.clone();
                Box::pin(async move {
                    let Ok(_running) = pass.try_lock_owned() else {
                        tracing::debug!(
                            "the previous sweep pass is still running; skipping this tick"
                        );
                        return;
                    };
                    if shutdown.is_cancelled() {
                        return;
                    }
                    if let Err(error) = orchestrator.sweep_once(&shutdown).await {
                        tracing::error!(%error, "scheduled sweep pass failed");
                    }
                })
            }
        })
        .with_context(|| format!("sweep.schedule {schedule:?}"))?;
        let scheduler = JobScheduler::new().await.context("creating the sweep scheduler")?;
        scheduler.add(job).await.context("scheduling the sweep")?;
        scheduler.start().await.context("starting the sweep scheduler")?;
        tracing::info!(schedule, "sweep scheduled");
        Ok(Self { scheduler, pass })
    }

    /// Stops ticking and waits for the pass in progress, which stops between rows once the
    /// shutdown token has fired.
    pub async fn stop(mut self) {
        if let Err(error) = self.scheduler.shutdown().await {
            tracing::warn!(%error, "stopping the sweep scheduler");
        }
        let _idle = self.pass.lock().await;
    }
}
