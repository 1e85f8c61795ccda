/*
 * chargeguard.pml: the charge protocol of one operation, for spin. model/README.md says what
 * is modelled, what is left out and why, and how to run it.
 *
 * Drift markers (tests/it/model.rs reads them): a CRASH marker names the code's crash_point
 * with its dots as underscores, a STEP marker a variant of domain::RecoveryStep; LEFT_OUT_CRASH
 * and LEFT_OUT_STEP markers name code that is deliberately not modelled. Every crash point and
 * step in src/ must be named one way or the other, and every name here must exist in src/.
 *
 * Time: `now` is the provider's clock in coarse ticks. Every other clock is a reading
 * now + offset, stored with K added so that readings stay non-negative.
 */

/* ---- bounds (spin -DN=3 -DTMAX=6 -DFAULTS=3 … for the larger check) ---- */
#ifndef N
#define N 2            /* consumer deliveries of the one operation */
#endif
#ifndef TMAX
#define TMAX 5         /* the provider's clock runs 0..TMAX */
#endif
#ifndef FAULTS
#define FAULTS 1       /* crashes, lost answers, 5xx/409, lapses, clock jumps, resends */
#endif

#define R 5            /* provider key retention (Stripe: 24 h) */
#define W 2            /* charge.key_window_safe_minutes (23 h) */
#define S 1            /* CLOCK_SKEW_TOLERANCE: the database reads within S of the provider */
#define K 2            /* replica clocks read within K of the provider (tests: 2 h, >> S) */
/* The create's call time is one tick: a create decided at tick t reaches the provider at t or
 * t + 1. config.rs accepts W + S + call < R; here 2 + 1 + 1 < 5. */

#ifdef PREFIX          /* the code before issue 14's fixes (0e80f8e, 4cd1e0d, e9333a9) */
#define PREFIX_CLOCK 1 /* window start and age on the deciding process's clock; leases too */
#define PREFIX_LEASE 1 /* a round whose lease lapsed answers APPLIED */
#define PREFIX_PARK 1  /* the sweep parks a row after CHECKS_MAX rounds */
#endif
#define CHECKS_MAX 2   /* sweep.check_count_max (72) before issue 14 */

#define CRASH(name) skip
#define STEP(name) skip

/* attempt status; the order is the order of allowed moves */
#define NONE 0
#define PENDING 1
#define SUCCEEDED 2
#define FAILED 3
#define terminal (status == SUCCEEDED || status == FAILED)

/* provider intent status */
#define I_NONE 0
#define I_PROCESSING 1
#define I_SUCCEEDED 2
#define I_DECLINED 3

/* recovery step chosen by choose_recovery_step */
#define ST_NONE 0
#define ST_RESEND 1
#define ST_RETRIEVE 2
#define ST_FIND 3          /* FindByMetadata { conclusive: false } */
#define ST_FIND_CONCL 4    /* FindByMetadata { conclusive: true } */

/* answers to a delivery */
#define A_NONE 0
#define A_APPLIED 1
#define A_DUPLICATE 2      /* DUPLICATE and RECONCILED: both say "decided" */
#define A_RETRY 3          /* UNAVAILABLE: outcome unknown, in progress, needs review */

/* ---- the database row (payment_attempts) ---- */
bool row_exists;
byte status;
byte lease_owner;      /* 0: free */
bool lapsed;           /* the holder's lease ran out (crash, or a stalled round) */
byte start;            /* key_window_started_at */
byte updated;          /* updated_at */
byte obj;              /* provider_payment_id: 0, or intent index + 1 */
bool flagged;          /* review_reason set */
byte checks;           /* check_count */

/* ---- the provider: intents and the idempotency table of the one key ---- */
byte ist[2];           /* status of intent 0 and 1; a second intent is already a defect */
byte nint;
byte charges;          /* intents that succeeded */
bool key_used;
byte key_first;        /* first use of the key, on the provider's clock */
bool key_pruned;
byte saved_obj;        /* the saved first answer, replayed for the key */
byte saved_st;
bool evs[2];           /* webhook events not yet settled, one per intent */

/* ---- clocks and faults ---- */
byte now;
byte sk[2];            /* replica r reads now + sk[r] - K */
byte dbk;              /* the database reads now + dbk - K */
byte faults;
bool stopped;          /* faults have stopped and clocks are right again */
byte fresh;            /* creates decided this tick and not yet received */
byte stale;            /* creates decided last tick and not yet received */

#define fault_ok (!stopped && faults < FAULTS)
#define proc_now(r) (now + sk[r])
#define db_now (now + dbk)
#define lease_free (lease_owner == 0 || lapsed)
#define MIN(a, b) ((a) < (b) -> (a) : (b))
#define MAX(a, b) ((a) > (b) -> (a) : (b))

/* finish_round and the webhook settle: `status = CASE WHEN status = ANY(allowed_sources)`.
 * allowed_sources(pending) is empty; succeeded and failed come only from pending. */
inline write_status(s) {
  if
  :: (s) != PENDING && status == PENDING -> status = (s)
  :: else -> skip
  fi;
  /* monotonic state: a terminal row never changes */
  assert(old_status == PENDING || status == old_status)
}

#ifdef PREFIX_CLOCK
/* before issue 14: one clock, the caller's; acquire_lease wrote it into updated_at before the
 * decision read it, so the clock-went-back guard was dead; unknown counted as expired */
#define stamp(r) proc_now(r)
inline decide_window(r) {
  p = proc_now(r);
  if
  :: p + S < start || p + S < updated || p >= start + W -> step = ST_FIND_CONCL
  :: else -> step = ST_RESEND
  fi
}
#else
/* KeyWindow::age: the latest reading ages the key, a reading before the start or the last
 * write (beyond the tolerance) makes the age unknown */
#define stamp(r) db_now
inline decide_window(r) {
  p = proc_now(r);
  if
  :: MAX(p, dbr) >= start + W -> step = ST_FIND_CONCL     /* KeyAge::Expired */
  :: else ->
     if
     :: MIN(p, dbr) + S < start || MIN(p, dbr) + S < updated -> step = ST_FIND /* Unknown */
     :: else -> step = ST_RESEND                                              /* Open */
     fi
  fi
}
#endif

/* choose_recovery_step, from the row and the readings taken with the lease */
inline decide(r) {
  if
  :: terminal -> step = ST_NONE
  :: else ->
     if
     :: obj != 0 -> step = ST_RETRIEVE
     :: else -> decide_window(r)
     fi
  fi;
  if
  :: step == ST_RESEND -> fresh++; sent_tick = now
  :: else -> skip
  fi
}

/* the lease statement (acquire_lease, claim_due); dbr is the database's reading it returns */
inline take_lease(me, r) {
  lease_owner = me; lapsed = 0; dbr = db_now;
#ifdef PREFIX_CLOCK
  updated = proc_now(r);
#endif
  b_status = status; b_obj = obj
}

/* a process holding the lease dies: the lease runs out (at once, which allows more) */
inline die_holding() {
  if
  :: lease_owner == me -> lapsed = 1
  :: else -> skip
  fi
}

inline new_intent() {
  assert(nint < 2);
  if
  :: ist[nint] = I_SUCCEEDED; charges++; assert(charges <= 1); evs[nint] = 1
  :: ist[nint] = I_DECLINED; evs[nint] = 1
  :: ist[nint] = I_PROCESSING
  fi;
  nint++
}

/* the provider receives a create with the attempt's key */
inline provider_create() {
#ifndef NO_RETENTION_ASSERT
  /* no create is ever sent with a key older than the retention, on the provider's clock */
  assert(!key_used || now < key_first + R);
#endif
  if
  :: key_used && !key_pruned -> res = saved_obj; rst = saved_st   /* replay */
  :: else ->
     if
     :: fault_ok -> faults++; res = 0                 /* 5xx before apply, or 409 key in use */
     :: true ->
        new_intent();
        key_used = 1; key_first = now; key_pruned = 0;
        saved_obj = nint; saved_st = ist[nint - 1];
        res = saved_obj; rst = saved_st;
        if
        :: fault_ok -> faults++; res = 0              /* apply_then_fail: the answer is lost */
        :: true -> skip
        fi
     fi
  fi
}

/* search and list by the attempt's metadata: consistent, or failing as a whole */
inline provider_lookup() {
  if
  :: fault_ok -> faults++; res = 0; looked = 0
  :: true ->
     looked = 1;
     if
     :: nint == 0 -> res = 0
     :: nint == 2 && ist[1] == I_SUCCEEDED -> res = 2; flag_double = 1
     :: nint == 2 && ist[1] != I_SUCCEEDED -> res = 1; flag_double = 1
     :: nint == 1 -> res = 1
     fi;
     if
     :: res != 0 -> rst = ist[res - 1]
     :: else -> skip
     fi
  fi
}

/* observe: one provider call for the chosen step; err means the outcome is unknown */
inline observe() {
  res = 0; rst = I_NONE; err = 0; flag_double = 0; looked = 0;
  atomic {
    if
    :: step == ST_RESEND ->
       STEP(ResendCreate);
       if
       :: sent_tick == now -> fresh--
       :: else -> stale--
       fi;
       provider_create();
       err = (res == 0)
    :: step == ST_RETRIEVE ->
       STEP(Retrieve);
       if
       :: fault_ok -> faults++; err = 1
       :: true -> res = obj; rst = ist[obj - 1]
       fi
    :: step == ST_FIND || step == ST_FIND_CONCL ->
       STEP(FindByMetadata);
       provider_lookup();
       /* nothing found ends the attempt only when conclusive and the lookup answered */
       err = (res == 0 && !(step == ST_FIND_CONCL && looked))
    fi
  }
}

#ifdef PREFIX_LEASE
/* before issue 14: no provider error means APPLIED (RECONCILED/DUPLICATE on redelivery),
 * whatever the row says and whoever holds it */
inline answer_round() {
  if
  :: err && !terminal -> ans = A_RETRY
  :: else -> ans = (inserted -> A_APPLIED : A_DUPLICATE)
  fi
}
#else
inline answer_round() {
  if
  :: terminal -> ans = (inserted && !lost && !err -> A_APPLIED : A_DUPLICATE)
  :: else ->
     if
     :: err || lost -> ans = A_RETRY
     :: else -> ans = (inserted -> A_APPLIED : A_DUPLICATE)    /* processing: the row says so */
     fi
  fi
}
#endif

/* APPLIED/DUPLICATE only for a decided row, or for the provider object this round recorded
 * (a processing intent: the reply carries status pending and the object) */
#define answer_ok (ans == A_RETRY || ans == A_NONE || terminal || (obj != 0 && !lost))

/* finish_round: a guarded write, only by the lease's owner; then the answer is computed from
 * the row as it stands (charge.rs `answered`). A crash between the provider's answer and the
 * write is a choice at the same instant, so it is taken in the same atomic step. */
inline finish_round(me, r) {
  atomic {
    if
    :: fault_ok -> faults++; CRASH(round_after_provider_call); die_holding(); ans = A_NONE
    :: true ->
       if
       :: lease_owner == me ->
          lost = 0;
          old_status = status;
          if
          :: err -> skip
          :: !err && res == 0 -> write_status(FAILED)                     /* expired */
          :: !err && res != 0 && rst == I_SUCCEEDED -> write_status(SUCCEEDED)
          :: !err && res != 0 && rst == I_DECLINED -> write_status(FAILED)
          :: !err && res != 0 && rst == I_PROCESSING -> write_status(PENDING)
          fi;
          if
          :: obj == 0 -> obj = res                                        /* COALESCE */
          :: else -> skip
          fi;
          if
          :: flag_double -> flagged = 1
          :: else -> skip
          fi;
#ifdef PREFIX_PARK
          if                                   /* counted up to the bound only: all it decides */
          :: checks < CHECKS_MAX -> checks++
          :: else -> skip
          fi;
#endif
          lease_owner = 0; lapsed = 0;
          updated = stamp(r)
       :: else -> lost = 1                              /* the lease ran out under the round */
       fi;
       answer_round();
       if
       :: inserted && fault_ok -> faults++; CRASH(charge_after_record); ans = A_NONE
       :: else -> skip
       fi
    fi;
    assert(answer_ok);
    forget()
  }
}

/* a finished round's locals say nothing more: cleared, so they do not multiply states */
inline forget() {
  p = 0; dbr = 0; step = 0; res = 0; rst = 0; sent_tick = 0; b_status = 0; b_obj = 0;
  old_status = 0; ans = 0; err = 0; lost = 0; looked = 0; flag_double = 0; inserted = 0
}

inline round(me, r) {
  observe();
  finish_round(me, r)
}

proctype delivery(byte me; byte r) {
  byte p, dbr, step, res, rst, sent_tick, b_status, b_obj, old_status, ans;
  bool err, lost, looked, flag_double, inserted;

  atomic {
    if
    :: fault_ok -> faults++; CRASH(charge_before_pending_commit); goto dead
    :: !row_exists ->
       /* insert_pending: one statement; the start is the earliest reading */
       row_exists = 1; status = PENDING; inserted = 1;
       lease_owner = me; lapsed = 0; dbr = db_now;
#ifdef PREFIX_CLOCK
       start = proc_now(r); updated = proc_now(r);
#else
       start = MIN(proc_now(r), db_now); updated = db_now;
#endif
       if
       :: fault_ok -> faults++; CRASH(charge_after_pending_commit); die_holding(); goto dead
       :: true -> decide(r)            /* the round reads the insert's database time */
       fi
    :: row_exists -> skip
    fi
  };
  if
  :: inserted -> goto round_it
  :: else -> skip
  fi;
  /* answer_existing: decided: DUPLICATE; else take a free lease, or wait a bounded time */
  atomic {
    if
    :: terminal -> ans = A_DUPLICATE; assert(answer_ok); goto dead
    :: lease_free -> take_lease(me, r)
#ifdef PREFIX_CLOCK
    /* a replica running ahead of the tolerance saw a live lease as expired */
    :: !lease_free && sk[r] > K + S -> take_lease(me, r)
#endif
    :: !terminal -> goto dead                  /* concurrent_wait ran out: UNAVAILABLE */
    fi;
    if
    :: flagged && obj == 0 -> lease_owner = 0; goto dead   /* NeedsReview: never sent again */
    :: else -> decide(r)
    fi;
    if
    :: step == ST_NONE -> lease_owner = 0; ans = A_DUPLICATE; assert(answer_ok); goto dead
    :: else -> skip
    fi
  };
round_it:
  round(me, r);
dead:
  atomic { forget() }
}

proctype sweeper(byte me; byte r) {
  byte p, dbr, step, res, rst, sent_tick, b_status, b_obj, old_status, ans;
  bool err, lost, looked, flag_double, inserted;
end_sweep:
  do
  :: atomic {
       row_exists && !terminal && lease_free && !(flagged && obj == 0) ->
       take_lease(me, r);
#ifdef PREFIX_PARK
       if
       :: checks >= CHECKS_MAX && obj == 0 ->   /* parked for review: never sent again */
          flagged = 1; lease_owner = 0; forget(); goto end_sweep
       :: else -> skip
       fi;
#endif
       decide(r)
     };
     /* a crash at round.after_provider_call restarts the sweeper with nothing held; a crash
      * at CRASH(sweep_mid_batch), after a row is finished, loses nothing the model holds, so
      * it is the same state as going on */
     round(me, r)
  od
}

/* the webhook worker: settles any pending event (so in any order), forward only, without the
 * lease; Stripe may send an event again */
proctype webhook(byte r) {
  byte i, old_status;
end_webhook:
  do
  :: atomic {
       (evs[0] || evs[1]) ->
       if
       :: evs[0] -> i = 0
       :: evs[1] -> i = 1
       fi;
       evs[i] = 0;
       old_status = status;
       if
       :: obj != 0 && obj != i + 1 -> flagged = 1         /* bound to another object */
       :: status == FAILED && ist[i] == I_SUCCEEDED -> flagged = 1   /* succeeded_after_failure */
       :: else ->
          write_status((ist[i] == I_SUCCEEDED -> SUCCEEDED : FAILED));
          if
          :: obj == 0 -> obj = i + 1
          :: else -> skip
          fi
       fi;
       updated = proc_now(r)     /* the inbox still stamps the worker's clock (issue 14 note) */
     }
  :: atomic { fault_ok && nint > 0 && !evs[0] && ist[0] != I_PROCESSING -> faults++; evs[0] = 1 }
  /* CRASH(webhook_mid_batch): the batch's unsettled events stay in the inbox and are
   * claimed again; the worker holds nothing else, so the crash is the same state as going on */
  od
}

/* the provider's own moves: forgetting a key after the retention, settling a processing intent */
proctype provider() {
  byte j;
end_provider:
  do
  :: atomic { key_used && !key_pruned && now >= key_first + R -> key_pruned = 1 }
  :: atomic {
       (ist[0] == I_PROCESSING || ist[1] == I_PROCESSING) ->
       j = (ist[0] == I_PROCESSING -> 0 : 1);
       if
       :: ist[j] = I_SUCCEEDED; charges++; assert(charges <= 1)
       :: ist[j] = I_DECLINED
       fi;
       evs[j] = 1
     }
  od
}

/* time, clock jumps, and the moment faults stop */
proctype environment() {
end_environment:
  do
  /* nothing before the insert depends on the absolute time: time starts with the row */
  :: atomic { row_exists && now < TMAX && stale == 0 -> now++; stale = fresh; fresh = 0 }
  :: atomic { fault_ok -> faults++;
       if :: sk[0] = 0 :: sk[0] = K :: sk[0] = 2 * K fi }
  :: atomic { fault_ok -> faults++;
       if :: sk[1] = 0 :: sk[1] = K :: sk[1] = 2 * K fi }
  :: atomic { fault_ok -> faults++;
       if :: dbk = K - S :: dbk = K + S fi }
  /* a live round stalls past its lease (a pause, a slow pool): the lease runs out under it */
  :: atomic { fault_ok && lease_owner != 0 && !lapsed -> faults++; lapsed = 1 }
#ifdef LIVENESS
  :: atomic { !stopped -> stopped = 1; sk[0] = K; sk[1] = K; dbk = K }
#endif
  od
}

init {
  byte i = 1;
  atomic {
    /* clocks start anywhere within their bounds */
    if :: sk[0] = 0 :: sk[0] = K :: sk[0] = 2 * K fi;
    if :: sk[1] = 0 :: sk[1] = K :: sk[1] = 2 * K fi;
    if :: dbk = K - S :: dbk = K :: dbk = K + S fi;
    do
    :: i <= N -> run delivery(i, i % 2); i++
    :: else -> break
    od;
    run sweeper(N + 1, 0);
    run sweeper(N + 2, 1);
    run webhook(0);
    run provider();
    run environment()
  }
}

#ifdef LIVENESS
/* no lost intent: once faults stop (and clocks are right), an accepted attempt ends */
ltl live { [] ((stopped && row_exists) -> <> (status == SUCCEEDED || status == FAILED)) }
#endif

/* Left out (model/README.md says why): refunds and later attempts of an operation.
 *   LEFT_OUT_CRASH(refund_before_pending_commit) LEFT_OUT_CRASH(refund_after_pending_commit)
 *   LEFT_OUT_CRASH(refund_after_record) LEFT_OUT_CRASH(attempts_after_previous_cancel)
 *   LEFT_OUT_STEP(Cancel) LEFT_OUT_STEP(RetrieveConfirmed)
 */
