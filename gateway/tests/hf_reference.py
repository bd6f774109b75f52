"""Reference token ids for gateway/tests/special_tokens.rs, computed with
Hugging Face's `tokenizers` package (pinned in .ci/requirements-tokenizers.txt).

Reads JSON from stdin: {"tokenizer": PATH, "prompts": [[[KIND, TEXT], ...], ...]}
where each prompt is the rendered chat as pieces, KIND "template" (markup
the chat template wrote) or "user" (message text copied into it). Writes
JSON to stdout: {"version": ..., "split": [[ids...], ...], "plain": [[ids...], ...]}.

- split: the prompt as it must be tokenized: special tokens are matched
  in template pieces only; the text between two of them (template and user
  text joined) is encoded with `encode_special_tokens = True`, HF's
  `split_special_tokens`, so special-token strings in it stay text.
- plain: the joined prompt encoded the ordinary way (every special-token
  string matched), for comparison.
"""

import json
import re
import sys

import tokenizers


def main():
    request = json.load(sys.stdin)
    tok = tokenizers.Tokenizer.from_file(request["tokenizer"])
    specials = {
        t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special
    }
    # Longest first, as leftmost-longest matching takes them.
    pattern = re.compile(
        "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True))
    )

    def encode(text, as_text):
        tok.encode_special_tokens = as_text
        return tok.encode(text, add_special_tokens=False).ids

    split, plain = [], []
    for pieces in request["prompts"]:
        ids, text = [], ""
        for kind, piece in pieces:
            if kind == "user":
                text += piece
                continue
            start = 0
            for m in pattern.finditer(piece):
                text += piece[start : m.start()]
                if text:
                    ids += encode(text, True)
                text = ""
                ids.append(specials[m.group(0)])
                start = m.end()
            text += piece[start:]
        if text:
            ids += encode(text, True)
        split.append(ids)
        plain.append(encode("".join(p for _, p in pieces), False))
    json.dump({"version": tokenizers.__version__, "split": split, "plain": plain}, sys.stdout)


if __name__ == "__main__":
    main()
