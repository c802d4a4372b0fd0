//! Unicode general categories for the pre-tokenizer patterns, answered in O(1) for the BMP.
//!
//! Each property is one bit; a character class asks for a mask of bits. The ranges come from
//! `unicode_tables.rs` (Oniguruma's view, so the fast path splits text exactly where `tokenizers`
//! does); the BMP is expanded once into a 128 KiB table, other planes use a binary search.

use std::sync::OnceLock;

use super::unicode_tables as t;

/// One bit per property. `\p{L}` is `LETTER`; the letter subcategories have their own bits.
pub type Props = u16;
pub const LETTER: Props = 1 << 0;
pub const NUMBER: Props = 1 << 1;
pub const PUNCT: Props = 1 << 2;
pub const SYMBOL: Props = 1 << 3;
pub const MARK: Props = 1 << 4;
pub const SPACE: Props = 1 << 5;
pub const UPPER: Props = 1 << 6;
pub const LOWER: Props = 1 << 7;
pub const TITLE: Props = 1 << 8;
pub const MODIFIER: Props = 1 << 9;
pub const OTHER_LETTER: Props = 1 << 10;
pub const OTHER: Props = 1 << 11;
pub const SEPARATOR: Props = 1 << 12;

const TABLES: [(Props, &[(u32, u32)]); 13] = [
    (LETTER, t::LETTER),
    (NUMBER, t::NUMBER),
    (PUNCT, t::PUNCT),
    (SYMBOL, t::SYMBOL),
    (MARK, t::MARK),
    (SPACE, t::SPACE),
    (UPPER, t::UPPER),
    (LOWER, t::LOWER),
    (TITLE, t::TITLE),
    (MODIFIER, t::MODIFIER),
    (OTHER_LETTER, t::OTHER_LETTER),
    (OTHER, t::OTHER),
    (SEPARATOR, t::SEPARATOR),
];

/// The property bit of a `\p{..}` name, as the patterns spell them.
pub fn property(name: &str) -> Option<Props> {
    Some(match name {
        "L" | "Letter" => LETTER,
        "N" | "Number" => NUMBER,
        "P" | "Punctuation" => PUNCT,
        "S" | "Symbol" => SYMBOL,
        "M" | "Mark" => MARK,
        "Lu" => UPPER,
        "Ll" => LOWER,
        "Lt" => TITLE,
        "Lm" => MODIFIER,
        "Lo" => OTHER_LETTER,
        "C" => OTHER,
        "Z" => SEPARATOR,
        _ => return None,
    })
}

fn bmp_table() -> &'static [Props] {
    static BMP: OnceLock<Vec<Props>> = OnceLock::new();
    BMP.get_or_init(|| {
        let mut table = vec![0 as Props; 0x10000];
        for (bit, ranges) in TABLES {
            for &(lo, hi) in ranges.iter().take_while(|r| r.0 < 0x10000) {
                for slot in &mut table[lo as usize..=(hi.min(0xFFFF) as usize)] {
                    *slot |= bit;
                }
            }
        }
        table
    })
}

/// All property bits of `c`.
#[inline]
pub fn props(c: char) -> Props {
    let cp = c as u32;
    if cp < 0x10000 {
        return bmp_table()[cp as usize];
    }
    let mut bits = 0;
    for (bit, ranges) in TABLES {
        if ranges.binary_search_by(|&(lo, hi)| range_order(lo, hi, cp)).is_ok() {
            bits |= bit;
        }
    }
    bits
}

fn range_order(lo: u32, hi: u32, cp: u32) -> std::cmp::Ordering {
    if hi < cp {
        std::cmp::Ordering::Less
    } else if lo > cp {
        std::cmp::Ordering::Greater
    } else {
        std::cmp::Ordering::Equal
    }
}

/// Python's `str.isspace()`: Unicode White_Space plus the four ASCII information separators.
pub fn is_python_space(c: char) -> bool {
    matches!(c, '\u{1c}'..='\u{1f}') || props(c) & SPACE != 0
}

/// Python's `str.isprintable()` for one character: not in categories C* or Z*, except the space.
pub fn is_python_printable(c: char) -> bool {
    c == ' ' || props(c) & (OTHER | SEPARATOR) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::utils::SysRegex;

    #[test]
    fn tables_match_oniguruma() {
        // Every scalar value, in order, checked against Oniguruma itself for each property.
        let all: String = (0u32..=0x10FFFF).filter_map(char::from_u32).collect();
        for (bit, class) in [
            (LETTER, r"\p{L}"),
            (NUMBER, r"\p{N}"),
            (PUNCT, r"\p{P}"),
            (SYMBOL, r"\p{S}"),
            (MARK, r"\p{M}"),
            (SPACE, r"\s"),
            (UPPER, r"\p{Lu}"),
            (OTHER, r"\p{C}"),
            (SEPARATOR, r"\p{Z}"),
        ] {
            let re = SysRegex::new(&format!("{class}+")).unwrap();
            let mut expected = vec![false; 0x110000];
            for (start, end) in re.find_iter(&all) {
                for c in all[start..end].chars() {
                    expected[c as usize] = true;
                }
            }
            for c in all.chars() {
                assert_eq!(
                    props(c) & bit != 0,
                    expected[c as usize],
                    "{class} at U+{:04X}",
                    c as u32
                );
            }
        }
    }

    #[test]
    fn python_space_and_printable() {
        assert!(is_python_space('\u{1f}') && is_python_space('\u{3000}') && is_python_space('\n'));
        assert!(!is_python_space('a') && !is_python_space('\u{200b}'));
        assert!(is_python_printable('é') && is_python_printable(' '));
        assert!(!is_python_printable('\u{200b}') && !is_python_printable('\u{a0}'));
    }
}
