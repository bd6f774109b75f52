//! Finding tags in streamed text without releasing half of one.

/// How much of `buf` can be released while waiting for `tag`: all of it
/// except a suffix that could still grow into `tag`, and (when
/// `hold_space` is set) the whitespace just before that, which is dropped
/// if a tag follows.
pub fn releasable(buf: &str, tag: &str, hold_space: bool) -> usize {
    let mut cut = buf.len();
    for k in (1..tag.len()).rev() {
        let start = buf.len().saturating_sub(k);
        if buf.len() >= k
            && buf.is_char_boundary(start)
            && tag.is_char_boundary(k)
            && buf[start..] == tag[..k]
        {
            cut = start;
            break;
        }
    }
    if hold_space {
        cut = buf[..cut].trim_end().len();
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_partial_tags_and_trailing_space() {
        assert_eq!(releasable("hello", "<think>", false), 5);
        assert_eq!(releasable("hello <th", "<think>", false), 6);
        assert_eq!(releasable("hello <th", "<think>", true), 5);
        assert_eq!(releasable("a<", "<tool_call>", false), 1);
        assert_eq!(releasable("a<x", "<tool_call>", false), 3);
        assert_eq!(releasable("é<tool_call", "<tool_call>", false), 2);
        assert_eq!(releasable("", "<think>", true), 0);
        assert_eq!(releasable("text \n", "<think>", true), 4);
        // Tags with multi-byte characters (Kimi, DeepSeek).
        assert_eq!(releasable("a◁thi", "◁think▷", false), 1);
        assert_eq!(releasable("a◁", "◁/think▷", false), 1);
        assert_eq!(releasable("ab", "◁think▷", false), 2);
        assert_eq!(releasable("x<｜tool", "<｜tool▁calls▁begin｜>", false), 1);
    }
}
