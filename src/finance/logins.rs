//! One-time login tickets and the sessions they open, in memory.
//!
//! A ticket is issued to an authenticated operator over gRPC (`CreateFinanceLogin`), travels
//! in a link, and is exchanged once for a session cookie; a session lasts
//! [`SESSION_TTL`]. Only SHA-256 digests of tickets and session ids are held, so a memory dump
//! gives neither; both are 256 random bits, so looking a digest up in a map says nothing about
//! how close a guess came. Both maps are bounded: when full, expired entries go first, then
//! the one that would expire soonest. A restart forgets every ticket and session (operators
//! ask for a new link).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::secret::Secret;

/// How long a login link can be used.
pub const TICKET_TTL: Duration = Duration::from_secs(5 * 60);
/// How long a session lasts after the link was opened (no sliding renewal).
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 60 * 60);
/// Unused tickets held at once.
const TICKETS_MAX: usize = 64;
/// Sessions held at once.
const SESSIONS_MAX: usize = 256;
/// Random bytes in a ticket or session id (hex-encoded).
const SECRET_BYTES: usize = 32;

/// Who a ticket or session belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Viewer {
    pub operator: String,
}

struct Entry {
    viewer: Viewer,
    expires_at: Instant,
}

/// Tickets and sessions; cheap to clone (shared by the gRPC service and the HTTP routes).
#[derive(Clone, Default)]
pub struct Logins {
    inner: Arc<Mutex<Maps>>,
}

#[derive(Default)]
struct Maps {
    tickets: HashMap<[u8; 32], Entry>,
    sessions: HashMap<[u8; 32], Entry>,
}

impl Logins {
    /// A new single-use ticket for `viewer`, valid for [`TICKET_TTL`].
    pub fn issue_ticket(&self, viewer: Viewer) -> Secret {
        let ticket = random_secret();
        let now = Instant::now();
        let mut maps = self.lock();
        insert_bounded(&mut maps.tickets, digest(ticket.expose()), Entry { viewer, expires_at: now + TICKET_TTL }, TICKETS_MAX, now);
        ticket
    }

    /// Exchanges a ticket (once) for a new session id; `None` for an unknown, used or expired
    /// ticket.
    pub fn open_session(&self, ticket: &str) -> Option<(Secret, Viewer)> {
        let now = Instant::now();
        let mut maps = self.lock();
        let entry = maps.tickets.remove(&digest(ticket))?;
        if entry.expires_at <= now {
            return None;
        }
        let session = random_secret();
        let viewer = entry.viewer;
        let session_entry = Entry { viewer: viewer.clone(), expires_at: now + SESSION_TTL };
        insert_bounded(&mut maps.sessions, digest(session.expose()), session_entry, SESSIONS_MAX, now);
        Some((session, viewer))
    }

    /// The viewer of a live session.
    pub fn session(&self, session: &str) -> Option<Viewer> {
        let now = Instant::now();
        let mut maps = self.lock();
        let key = digest(session);
        match maps.sessions.get(&key) {
            Some(entry) if entry.expires_at > now => Some(entry.viewer.clone()),
            Some(_) => {
                maps.sessions.remove(&key);
                None
            }
            None => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Maps> {
        // A panic while holding the lock leaves the maps consistent (every change is one call).
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn insert_bounded(map: &mut HashMap<[u8; 32], Entry>, key: [u8; 32], entry: Entry, entries_max: usize, now: Instant) {
    if map.len() >= entries_max {
        map.retain(|_, entry| entry.expires_at > now);
    }
    while map.len() >= entries_max {
        let soonest = map.iter().min_by_key(|(_, entry)| entry.expires_at).map(|(key, _)| *key);
        match soonest {
            Some(soonest) => map.remove(&soonest),
            None => break,
        };
    }
    map.insert(key, entry);
}

fn random_secret() -> Secret {
    let mut bytes = [0u8; SECRET_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    Secret::new(hex::encode(bytes))
}

fn digest(value: &str) -> [u8; 32] {
    Sha256::digest(value.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn viewer(name: &str) -> Viewer {
        Viewer { operator: name.to_owned() }
    }

    #[test]
    fn a_ticket_opens_one_session_once() {
        let logins = Logins::default();
        let ticket = logins.issue_ticket(viewer("finance"));
        let (session, opened) = logins.open_session(ticket.expose()).expect("a fresh ticket opens a session");
        assert_eq!(opened, viewer("finance"));
        assert_eq!(logins.session(session.expose()), Some(viewer("finance")));
        assert!(logins.open_session(ticket.expose()).is_none(), "a used ticket opens nothing");
        assert!(logins.session(ticket.expose()).is_none(), "a ticket is not a session");
        assert!(logins.session("0".repeat(64).as_str()).is_none());
    }

    #[test]
    fn tickets_and_sessions_are_bounded() {
        let logins = Logins::default();
        let tickets: Vec<Secret> = (0..TICKETS_MAX + 10).map(|_| logins.issue_ticket(viewer("admin"))).collect();
        assert_eq!(logins.lock().tickets.len(), TICKETS_MAX);
        let opened = tickets.iter().filter(|ticket| logins.open_session(ticket.expose()).is_some()).count();
        assert_eq!(opened, TICKETS_MAX, "the oldest tickets were dropped to make room");
        for _ in 0..SESSIONS_MAX {
            let ticket = logins.issue_ticket(viewer("admin"));
            logins.open_session(ticket.expose()).unwrap();
        }
        assert_eq!(logins.lock().sessions.len(), SESSIONS_MAX);
    }

    #[test]
    fn an_expired_ticket_opens_nothing() {
        let logins = Logins::default();
        let ticket = logins.issue_ticket(viewer("finance"));
        for entry in logins.lock().tickets.values_mut() {
            entry.expires_at = Instant::now();
        }
        assert!(logins.open_session(ticket.expose()).is_none());
    }
}
