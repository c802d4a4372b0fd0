//! Session bookings (`book_session_s`): where each session's last request went, and how many leading
//! blocks of its prompt, for a few seconds. A request of the same session whose prompt starts with
//! those blocks counts them as held there, before the engine's KV events show them: a turn sent while
//! the previous one is still queued or prefilling follows it instead of prefilling the history again
//! elsewhere. Only the session's own requests see its booking, so a burst of another session's
//! requests sharing the prefix is routed as without it (booking every prompt, `book_routed_s`, draws
//! such bursts onto one engine).
//!
//! A booking is the last block's chain hash and the block count: the chain hash covers every block
//! before it, so one comparison tells whether a prompt starts with the booked one. One mutex over a
//! bounded map: a pick takes it for one lookup and one insert.

use std::collections::HashMap;
use std::sync::Mutex;

use super::block_hash::BlockHash;
use super::endpoint_set::EndpointId;
use super::membership::Tick;

/// Sessions booked at most; past it, expired bookings are dropped, and if none has expired the new one
/// is not made (a bound on memory: ~40 bytes each). The sweep walks the whole map under the lock, so it
/// runs at most once per tick: a pool with more live sessions than this does not pay it on every pick.
const MAX_SESSIONS: usize = 1 << 16;

#[derive(Clone, Copy, Debug)]
struct Booking {
    at: EndpointId,
    block_size: u32,
    blocks: u32,
    last: BlockHash,
    until: Tick,
}

pub struct SessionBookings {
    lease: Tick,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    sessions: HashMap<u64, Booking>,
    /// The tick of the last sweep for room.
    swept: Option<Tick>,
}

impl SessionBookings {
    pub fn new(lease: Tick) -> Self {
        SessionBookings {
            lease,
            state: Mutex::new(State::default()),
        }
    }

    /// Books `hashes` (the prompt's chain at `block_size`) on endpoint `at` for `session`, replacing
    /// its previous booking.
    pub fn book(&self, session: u64, at: EndpointId, block_size: u32, hashes: &[BlockHash], now: Tick) {
        let Some(&last) = hashes.last() else {
            return;
        };
        let mut state = self.lock();
        if state.sessions.len() >= MAX_SESSIONS && !state.sessions.contains_key(&session) {
            if state.swept == Some(now) {
                return;
            }
            state.swept = Some(now);
            state.sessions.retain(|_, b| b.until > now);
            if state.sessions.len() >= MAX_SESSIONS {
                return;
            }
        }
        let booking = Booking {
            at,
            block_size,
            blocks: hashes.len() as u32,
            last,
            until: now.saturating_add(self.lease),
        };
        state.sessions.insert(session, booking);
    }

    /// The endpoint `session` is booked on and the blocks it holds there, when the booking is live, of
    /// `block_size`, and `hashes` (a prompt's chain) starts with the booked prompt.
    pub fn held(&self, session: u64, block_size: u32, hashes: &[BlockHash], now: Tick) -> Option<(EndpointId, u32)> {
        let b = *self.lock().sessions.get(&session)?;
        let starts_with = b.blocks as usize <= hashes.len() && hashes[b.blocks as usize - 1] == b.last;
        (b.until > now && b.block_size == block_size && starts_with).then_some((b.at, b.blocks))
    }

    /// Whether `session` has a live booking (a request of it was routed within the lease).
    pub fn live(&self, session: u64, now: Tick) -> bool {
        self.lock().sessions.get(&session).is_some_and(|b| b.until > now)
    }

    /// Forgets the bookings on a removed endpoint (its id may be reused).
    pub fn clear(&self, at: EndpointId) {
        self.lock().sessions.retain(|_, b| b.at != at);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock means a panic mid-insert elsewhere; the map is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_booking_holds_for_prompts_that_start_with_it_until_it_expires() {
        let b = SessionBookings::new(30);
        b.book(7, 2, 16, &[11, 12, 13], 100);
        assert_eq!(b.held(7, 16, &[11, 12, 13, 14], 101), Some((2, 3)));
        assert_eq!(b.held(7, 16, &[11, 12, 13], 129), Some((2, 3)));
        assert_eq!(b.held(7, 16, &[11, 12, 99, 14], 101), None, "another prompt");
        assert_eq!(b.held(7, 16, &[11, 12], 101), None, "shorter than the booking");
        assert_eq!(b.held(7, 32, &[11, 12, 13, 14], 101), None, "another block size");
        assert_eq!(b.held(8, 16, &[11, 12, 13, 14], 101), None, "another session");
        assert_eq!(b.held(7, 16, &[11, 12, 13, 14], 130), None, "expired");
        assert!(b.live(7, 129) && !b.live(7, 130) && !b.live(8, 101));
        // The session's next request replaces it; a removed endpoint's bookings go.
        b.book(7, 1, 16, &[11, 12, 13, 14], 110);
        assert_eq!(b.held(7, 16, &[11, 12, 13, 14, 15], 111), Some((1, 4)));
        b.clear(1);
        assert_eq!(b.held(7, 16, &[11, 12, 13, 14, 15], 111), None);
    }

    #[test]
    fn past_the_bound_a_new_session_is_booked_only_once_older_bookings_expired() {
        let b = SessionBookings::new(30);
        for session in 0..MAX_SESSIONS as u64 {
            b.book(session, 0, 16, &[session], 100);
        }
        let new = MAX_SESSIONS as u64;
        b.book(new, 0, 16, &[new], 110);
        assert_eq!(b.held(new, 16, &[new], 111), None, "full of live bookings: not booked");
        // A booked session still moves its own booking.
        b.book(5, 1, 16, &[5, 6], 110);
        assert_eq!(b.held(5, 16, &[5, 6], 111), Some((1, 2)));
        // Once the first bookings expired, the next new session makes room and is booked.
        b.book(new, 0, 16, &[new], 131);
        assert_eq!(b.held(new, 16, &[new], 132), Some((0, 1)));
        assert_eq!(b.held(0, 16, &[0], 132), None);
        assert!(b.lock().sessions.len() <= MAX_SESSIONS);
    }
}
