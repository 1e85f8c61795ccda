//! Crash points for tests of SEMANTICS.md's crash table. Built only with the `failpoints`
//! feature; otherwise `crash_point` compiles to nothing.
//!
//! A crash point configured with any action (`FAILPOINTS='charge.after_pending_commit=return'`)
//! ends the whole process on the spot, the way a power cut or a kill -9 would: no destructor,
//! no rollback, no reply. Tests run such a process as a child (`chargeguard serve`) and then
//! check that redelivery or the sweep, in another process, finishes what it left.
//!
//! | name                           | where                                                            |
//! |--------------------------------|------------------------------------------------------------------|
//! | `charge.before_pending_commit` | the call is validated, nothing is written yet                    |
//! | `charge.after_pending_commit`  | the pending row is committed, the provider not yet called        |
//! | `round.after_provider_call`    | the provider answered (a charge or a refund), the result is not yet recorded |
//! | `charge.after_record`          | the result is recorded, the caller has not heard                 |
//! | `attempts.after_previous_cancel` | attempt n's intent canceled at the provider, the cancel not yet recorded on n, attempt n + 1 not written |
//! | `refund.before_pending_commit` | a refund call is validated, nothing is written yet               |
//! | `refund.after_pending_commit`  | the pending refund row is committed, the provider not yet called |
//! | `refund.after_record`          | the refund's result is recorded, the caller has not heard        |
//! | `sweep.mid_batch`              | the sweep finished one row of its pass (others may be in flight) |
//! | `webhook.mid_batch`            | the webhook worker settled one event of a claimed batch          |

/// The exit code of a process that stopped at a crash point.
pub const CRASH_EXIT_CODE: i32 = 86;

#[inline]
pub fn crash_point(name: &'static str) {
    #[cfg(feature = "failpoints")]
    {
        fail::eval(name, |_| {
            eprintln!("crash point {name}: exiting as if killed");
            std::process::exit(CRASH_EXIT_CODE)
        });
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}
