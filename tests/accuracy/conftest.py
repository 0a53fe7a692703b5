import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from runbook.corpus import code_text


def train_tokenizer(d, vocab_size=300):
    """A small BPE tokenizer trained on the corpus, saved as d/tokenizer.json (the KLD probe needs one; which one
    does not matter, but two vocab sizes cut the corpus into other ids)."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([code_text()[:50_000]], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]"],
                                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(d / "tokenizer.json"))
    return d


@pytest.fixture(scope="module")
def tokdir(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok"))
