//! First-token and inter-token deadlines of an engine call (settings `first_token_timeout` and
//! `inter_token_timeout`; docs/reliability.md, "Engine deadlines"). A stalled engine keeps its health
//! check answering, so only the silence of its call tells: the call whose engine sent nothing for the
//! deadline is ended (504, or an SSE error event once the stream began), aborted, and its endpoint
//! penalised.
//!
//! A streamed call's engine sends one message per step: the first must come within `first_token` of
//! the request going out, each next within `inter_token` of the previous. A non-streamed call's engine
//! answers once, at the end, so its one deadline covers the whole generation:
//! `first_token + inter_token × max_tokens`.

use std::time::{Duration, Instant};

/// The configured deadlines; `Duration::ZERO` turns one off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    pub first_token: Duration,
    pub inter_token: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            first_token: Duration::from_secs(60),
            inter_token: Duration::from_secs(30),
        }
    }
}

impl Deadlines {
    /// How long a non-streamed call producing up to `max_tokens` may take (`None` when off).
    pub fn whole_call(&self, max_tokens: u32) -> Option<Duration> {
        if self.first_token.is_zero() || self.inter_token.is_zero() {
            return None;
        }
        Some(
            self.first_token
                .saturating_add(self.inter_token.saturating_mul(max_tokens)),
        )
    }
}

/// Which deadline a call missed, for the client's error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    FirstToken(Duration),
    NextToken(Duration),
    WholeCall(Duration),
}

impl Missed {
    pub fn message(&self) -> String {
        match self {
            Missed::FirstToken(d) => format!(
                "the engine sent no first token within {} s (first_token_timeout)",
                d.as_secs_f64()
            ),
            Missed::NextToken(d) => format!(
                "the engine sent no next token within {} s (inter_token_timeout)",
                d.as_secs_f64()
            ),
            Missed::WholeCall(d) => format!(
                "the engine did not answer within {} s (first_token_timeout + inter_token_timeout × max_tokens)",
                d.as_secs_f64()
            ),
        }
    }
}

/// One call's clock: when its current deadline falls and which one it is.
#[derive(Debug, Clone, Copy)]
pub struct CallClock {
    /// The last progress: the request going out, then each engine message.
    since: Instant,
    first: Option<Duration>,
    next: Option<Duration>,
    /// Nothing arrived yet.
    waiting_first: bool,
    streamed: bool,
}

impl CallClock {
    /// A streamed call that went out at `now`.
    pub fn streamed(deadlines: Deadlines, now: Instant) -> Self {
        let on = |d: Duration| (!d.is_zero()).then_some(d);
        CallClock {
            since: now,
            first: on(deadlines.first_token),
            next: on(deadlines.inter_token),
            waiting_first: true,
            streamed: true,
        }
    }

    /// A non-streamed call of up to `max_tokens` tokens that went out at `now`.
    pub fn whole(deadlines: Deadlines, max_tokens: u32, now: Instant) -> Self {
        CallClock {
            since: now,
            first: deadlines.whole_call(max_tokens),
            next: None,
            waiting_first: true,
            streamed: false,
        }
    }

    /// The engine sent something at `now`.
    pub fn progress(&mut self, now: Instant) {
        self.since = now;
        self.waiting_first = false;
    }

    /// Nothing arrived yet.
    pub fn waiting_first(&self) -> bool {
        self.waiting_first
    }

    fn budget(&self) -> Option<Duration> {
        if self.waiting_first {
            self.first
        } else if self.streamed {
            self.next
        } else {
            None // the one answer is arriving
        }
    }

    /// When the call times out unless the engine sends something (`None`: never).
    pub fn deadline(&self) -> Option<Instant> {
        self.budget().map(|b| self.since + b)
    }

    /// The deadline missed at `now`, if any.
    pub fn missed(&self, now: Instant) -> Option<Missed> {
        let budget = self.budget()?;
        if now < self.since + budget {
            return None;
        }
        Some(match (self.streamed, self.waiting_first) {
            (false, _) => Missed::WholeCall(budget),
            (true, true) => Missed::FirstToken(budget),
            (true, false) => Missed::NextToken(budget),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn deadlines(first: u32, next: u32) -> Deadlines {
        Deadlines {
            first_token: first * S,
            inter_token: next * S,
        }
    }

    #[test]
    fn a_stream_has_a_first_token_deadline_then_one_per_token() {
        let t0 = Instant::now();
        let mut clock = CallClock::streamed(deadlines(10, 3), t0);
        assert_eq!(clock.deadline(), Some(t0 + 10 * S));
        assert_eq!(clock.missed(t0 + 9 * S), None);
        assert_eq!(clock.missed(t0 + 10 * S), Some(Missed::FirstToken(10 * S)));
        clock.progress(t0 + 2 * S);
        assert_eq!(
            clock.deadline(),
            Some(t0 + 5 * S),
            "the next token is due sooner than the first was"
        );
        assert_eq!(clock.missed(t0 + 5 * S), Some(Missed::NextToken(3 * S)));
        clock.progress(t0 + 4 * S);
        assert_eq!(clock.missed(t0 + 6 * S), None);
    }

    #[test]
    fn a_non_streamed_call_has_one_deadline_for_the_whole_generation() {
        let t0 = Instant::now();
        let mut clock = CallClock::whole(deadlines(10, 2), 16, t0);
        assert_eq!(clock.deadline(), Some(t0 + 42 * S));
        assert_eq!(clock.missed(t0 + 42 * S), Some(Missed::WholeCall(42 * S)));
        clock.progress(t0 + S);
        assert_eq!(clock.deadline(), None, "the answer is arriving");
    }

    #[test]
    fn zero_turns_a_deadline_off() {
        let t0 = Instant::now();
        let mut clock = CallClock::streamed(deadlines(0, 3), t0);
        assert_eq!(clock.deadline(), None);
        clock.progress(t0);
        assert_eq!(clock.deadline(), Some(t0 + 3 * S));
        assert_eq!(CallClock::whole(deadlines(5, 0), 10, t0).deadline(), None);
        assert_eq!(
            deadlines(60, 30).whole_call(u32::MAX).map(|d| d > 60 * S),
            Some(true),
            "no overflow"
        );
    }

    #[test]
    fn messages_name_the_setting() {
        assert!(Missed::FirstToken(S).message().contains("first_token_timeout"));
        assert!(Missed::NextToken(S).message().contains("inter_token_timeout"));
    }
}
