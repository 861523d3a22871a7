import pytest


def build_char_tokenizer():
    """A character-level HF tokenizer built in memory (no hub): one id per character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["<unk>", "\n", "\t", *(chr(c) for c in range(32, 127))]
    backend = Tokenizer(models.WordLevel(vocab={c: i for i, c in enumerate(chars)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


@pytest.fixture(scope="session")
def char_tokenizer():
    return build_char_tokenizer()
