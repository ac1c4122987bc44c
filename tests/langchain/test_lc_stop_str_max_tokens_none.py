"""A stop given as one string is one stop (it was split into characters), and max_tokens=None
per call means the model's default (it was a validation error), as in ChatOpenAI."""
from langchain_ensemble import ChatEnsemble
from tests.toy import registered_members, toy_member

STOP = "in. +"


def test_str_stop_is_one_stop_and_max_tokens_none_is_default() -> None:
    members = [toy_member("st-a", "byte_level", "llama", 1), toy_member("st-b", "metaspace", "gpt2", 2)]
    with registered_members(members) as names:
        lc = ChatEnsemble(models=names, method="every-token", max_tokens=20)
        as_list = lc.invoke("Lena", stop=[STOP]).content
        assert lc.invoke("Lena", stop=STOP).content == as_list
        assert "".join(c.text for c in lc.stream("Lena", stop=STOP)) == as_list
        assert lc.bind(stop=STOP).invoke("Lena").content == as_list
        assert lc.invoke("Lena", max_tokens=None).content == lc.invoke("Lena").content


def test_the_constructor_takes_a_str_stop_and_max_tokens_none_as_chat_openai_does() -> None:
    """ChatEnsemble(stop="x") and ChatEnsemble(max_tokens=None) were pydantic validation errors."""
    members = [toy_member("st-c", "byte_level", "llama", 1), toy_member("st-d", "metaspace", "gpt2", 2)]
    with registered_members(members) as names:
        as_str = ChatEnsemble(models=names, method="every-token", max_tokens=20, stop=STOP)
        assert as_str.stop == [STOP]
        as_list = ChatEnsemble(models=names, method="every-token", max_tokens=20, stop=[STOP])
        assert as_str.invoke("Lena").content == as_list.invoke("Lena").content
        assert ChatEnsemble(models=names, max_tokens=None).max_tokens == 256
