//! The fault description a [`ChaosProxy`](super::ChaosProxy) applies, and its validation.
//!
//! [`Faults`] is plain data (serde, JSON over the control API): the proxy reads the current
//! value at every accept and at every chunk it forwards, so a change applies to live and new
//! connections at once. `Faults::default()` is "no fault": a transparent proxy.
//!
//! Promise: a [`Faults`] accepted by [`Faults::validate`] can never make the proxy panic, spin,
//! or allocate beyond its configured bounds.

use serde::{Deserialize, Serialize};

use super::ChaosError;

/// Largest accepted `delay_ms` and `jitter_ms`, in milliseconds (one hour): a larger value is a
/// typo, and would pin the in-flight buffers of every connection for longer than any test.
pub const DELAY_MS_MAX: u64 = 3_600_000;

/// Faults applied by the proxy. Every field defaults to "off"; JSON may omit any field.
///
/// Semantics, in the order the proxy applies them:
/// - `reset`: every live connection is reset (RST to both peers) and every new one is reset at
///   accept, for as long as the flag is set.
/// - `refuse_probability`: each new connection is, with this probability, closed with RST right
///   after accept; the upstream never hears of it. (A listening socket cannot answer
///   `ECONNREFUSED`: the client sees its connect succeed, then `ECONNRESET` or EOF.)
/// - `black_hole`: bytes in both directions are read and discarded; nothing is forwarded or
///   answered; new connections are accepted but the upstream is not dialled. When the flag is
///   cleared, a connection that discarded at least one byte is reset (the proxy never delivers a
///   stream with a hole in it; a real partition that long would end in a TCP timeout too), and a
///   connection that discarded nothing carries on untouched.
/// - per direction ([`DirectionFaults`]): delay and jitter, per-chunk reset, one-way cut,
///   bandwidth cap.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Seed of the proxy's random choices (refusals, per-chunk resets, jitter). The same seed and
    /// the same sequence of connections and chunks give the same choices.
    pub seed: u64,
    /// Reset every live and new connection while set.
    pub reset: bool,
    /// Probability in `[0, 1]` that a new connection is closed with RST at accept.
    pub refuse_probability: f64,
    /// Read and discard everything, forward nothing (see the type's docs for healing).
    pub black_hole: bool,
    /// Faults on bytes from the client to the upstream.
    pub to_upstream: DirectionFaults,
    /// Faults on bytes from the upstream to the client.
    pub to_client: DirectionFaults,
}

/// Faults on one direction of every connection.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DirectionFaults {
    /// Fixed delay added to every chunk, in milliseconds.
    pub delay_ms: u64,
    /// Extra delay drawn uniformly from `[0, jitter_ms]` per chunk, in milliseconds. Byte order
    /// is kept: a chunk is never forwarded before the one read ahead of it.
    pub jitter_ms: u64,
    /// Probability in `[0, 1]` that a chunk read in this direction resets the whole connection
    /// (RST to both peers) instead of being forwarded. Bytes are never silently dropped from
    /// inside a stream: that would corrupt framing rather than model a network fault.
    pub reset_probability: f64,
    /// Hold bytes in this direction: the proxy keeps reading into its bounded buffer (then TCP
    /// back-pressure stalls the sender) and forwards nothing until the cut is cleared; then the
    /// held bytes are delivered in order, as TCP retransmission would after a healed partition.
    pub cut: bool,
    /// Bandwidth cap, in bytes per second (token bucket, empty when the cap is set, holding at
    /// most one chunk); `None` is unlimited.
    pub bandwidth_bytes_per_second: Option<u64>,
}

/// One direction of a proxied connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Client to upstream.
    ToUpstream,
    /// Upstream to client.
    ToClient,
}

impl Direction {
    /// The faults of this direction.
    pub fn of(self, faults: &Faults) -> &DirectionFaults {
        match self {
            Direction::ToUpstream => &faults.to_upstream,
            Direction::ToClient => &faults.to_client,
        }
    }

    /// Short name for logs.
    pub fn name(self) -> &'static str {
        match self {
            Direction::ToUpstream => "to_upstream",
            Direction::ToClient => "to_client",
        }
    }
}

impl Faults {
    /// No fault: the proxy forwards bytes untouched.
    pub fn none() -> Self {
        Self::default()
    }

    /// Checks every field; the proxy refuses a value that fails.
    pub fn validate(&self) -> Result<(), ChaosError> {
        check_probability("refuse_probability", self.refuse_probability)?;
        for dir in [Direction::ToUpstream, Direction::ToClient] {
            dir.of(self).validate(dir.name())?;
        }
        Ok(())
    }
}

impl DirectionFaults {
    fn validate(&self, name: &str) -> Result<(), ChaosError> {
        check_probability(&format!("{name}.reset_probability"), self.reset_probability)?;
        for (field, value) in [("delay_ms", self.delay_ms), ("jitter_ms", self.jitter_ms)] {
            if value > DELAY_MS_MAX {
                return Err(ChaosError::InvalidFaults(format!(
                    "{name}.{field} = {value} exceeds {DELAY_MS_MAX}"
                )));
            }
        }
        if self.bandwidth_bytes_per_second == Some(0) {
            return Err(ChaosError::InvalidFaults(format!(
                "{name}.bandwidth_bytes_per_second must be at least 1 (use `cut` to stop a direction)"
            )));
        }
        Ok(())
    }
}

fn check_probability(field: &str, p: f64) -> Result<(), ChaosError> {
    if p.is_finite() && (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(ChaosError::InvalidFaults(format!(
            "{field} = {p} is not a probability in [0, 1]"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_round_trips_through_json() {
        let f = Faults::default();
        f.validate().unwrap();
        let json = serde_json::to_string(&f).unwrap();
        assert_eq!(serde_json::from_str::<Faults>(&json).unwrap(), f);
        assert_eq!(serde_json::from_str::<Faults>("{}").unwrap(), f);
    }

    #[test]
    fn partial_json_fills_defaults_and_unknown_fields_are_rejected() {
        let f: Faults = serde_json::from_str(r#"{"to_client":{"delay_ms":5}}"#).unwrap();
        assert_eq!(f.to_client.delay_ms, 5);
        assert_eq!(f.to_upstream, DirectionFaults::default());
        assert!(serde_json::from_str::<Faults>(r#"{"blackhole":true}"#).is_err());
    }

    #[test]
    fn invalid_values_are_refused() {
        let cases = [
            Faults {
                refuse_probability: 1.5,
                ..Faults::default()
            },
            Faults {
                refuse_probability: f64::NAN,
                ..Faults::default()
            },
            Faults {
                to_upstream: DirectionFaults {
                    reset_probability: -0.1,
                    ..DirectionFaults::default()
                },
                ..Faults::default()
            },
            Faults {
                to_client: DirectionFaults {
                    delay_ms: DELAY_MS_MAX + 1,
                    ..DirectionFaults::default()
                },
                ..Faults::default()
            },
            Faults {
                to_client: DirectionFaults {
                    bandwidth_bytes_per_second: Some(0),
                    ..DirectionFaults::default()
                },
                ..Faults::default()
            },
        ];
        for f in cases {
            assert!(
                matches!(f.validate(), Err(ChaosError::InvalidFaults(_))),
                "{f:?}"
            );
        }
    }
}
