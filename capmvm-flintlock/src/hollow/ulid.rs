//! ULIDs as flintlock makes them (oklog/ulid): 48 bits of Unix milliseconds, 80 bits of entropy,
//! monotonic within a millisecond, written as 26 upper-case Crockford base32 characters.

use std::time::{SystemTime, UNIX_EPOCH};

use ring::rand::{SecureRandom as _, SystemRandom};

const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const ENTROPY_MASK: u128 = (1 << 80) - 1;

/// Generates increasing ULIDs.
pub(crate) struct UlidGenerator {
    random: SystemRandom,
    last_millis: u64,
    last_entropy: u128,
}

impl UlidGenerator {
    pub(crate) fn new() -> Self {
        UlidGenerator {
            random: SystemRandom::new(),
            last_millis: 0,
            last_entropy: 0,
        }
    }

    /// The next ULID. Within one millisecond the entropy is incremented (oklog's monotonic mode),
    /// so ULIDs sort in creation order.
    pub(crate) fn next(&mut self) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let mut millis = u64::try_from(now).unwrap_or(u64::MAX) & ((1 << 48) - 1);
        // A clock that went backwards must not produce a smaller ULID.
        if millis < self.last_millis {
            millis = self.last_millis;
        }
        let entropy = if millis == self.last_millis && self.last_entropy < ENTROPY_MASK {
            self.last_entropy + 1
        } else {
            if millis == self.last_millis {
                // The entropy of this millisecond is used up: borrow the next millisecond.
                millis += 1;
            }
            self.fresh_entropy()
        };
        self.last_millis = millis;
        self.last_entropy = entropy;
        encode((u128::from(millis) << 80) | entropy)
    }

    fn fresh_entropy(&self) -> u128 {
        let mut bytes = [0u8; 16];
        // SystemRandom only fails if the OS has no entropy source; a timestamp-only ULID is still
        // unique enough for a simulator thanks to the monotonic increment.
        if self.random.fill(&mut bytes[6..]).is_err() {
            return 0;
        }
        u128::from_be_bytes(bytes) & ENTROPY_MASK
    }
}

fn encode(value: u128) -> String {
    (0..26)
        .rev()
        .map(|i| char::from(ALPHABET[((value >> (i * 5)) & 0x1f) as usize]))
        .collect()
}

/// Whether `text` is a ULID in canonical form.
pub fn is_ulid(text: &str) -> bool {
    text.len() == 26 && text.bytes().all(|b| ALPHABET.contains(&b)) && text.as_bytes()[0] <= b'7'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulids_are_canonical_unique_and_increasing() {
        let mut generator = UlidGenerator::new();
        let ulids: Vec<String> = (0..1000).map(|_| generator.next()).collect();
        for pair in ulids.windows(2) {
            assert!(pair[0] < pair[1], "{} !< {}", pair[0], pair[1]);
        }
        assert!(ulids.iter().all(|u| is_ulid(u)), "{:?}", &ulids[..3]);
    }

    #[test]
    fn encoding_matches_the_spec_example() {
        // Timestamp 1469918176385 (2016-07-30T22:36:16.385Z) with zero entropy.
        assert_eq!(
            encode(1_469_918_176_385u128 << 80),
            "01ARYZ6S410000000000000000"
        );
        assert!(is_ulid("01KE75BHT9H6D7V5YG0KYGRXX2"));
        assert!(!is_ulid("01KE75BHT9H6D7V5YG0KYGRXXU"));
    }
}
