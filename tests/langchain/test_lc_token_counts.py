"""``ChatEnsemble``'s token counts are the most any member needs (``EnsembleEngine.prompt_tokens``):
the limit it reports is the smallest member's window, so a history ``trim_messages(token_counter=llm)``
cut to it must fit every member, not only the drafter. Tiny random members with two tokenizers."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, trim_messages

from langchain_ensemble import ChatEnsemble
from langchain_ensemble.chat_models import to_engine_messages
from tests.toy import registered_members, toy_member

MAX_TOKENS = 8


def test_a_history_trimmed_to_the_limit_by_the_model_fits_every_member() -> None:
    # the byte-level drafter spells this text in far fewer tokens than the metaspace verifier
    members = [toy_member("lc-count-bpe", "byte_level", "llama", 0), toy_member("lc-count-sp", "metaspace", "llama", 1)]
    history = [SystemMessage("Be brief."),
               *[HumanMessage("Tom walked to the park. " * 20), AIMessage("ok " * 20)] * 10,
               HumanMessage("last")]
    with registered_members(members) as names:
        llm = ChatEnsemble(models=names, max_tokens=MAX_TOKENS)
        limit = llm.context_window - MAX_TOKENS
        trimmed = trim_messages(history, max_tokens=limit, token_counter=llm, strategy="last",
                                include_system=True, start_on="human")
        assert 2 < len(trimmed) < len(history)
        llm.invoke(trimmed)  # before: ContextLengthError (the verifier's prompt over its window)
        prompt = to_engine_messages(trimmed)
        counts = [len(m.prompt_ids(prompt)) for m in members]
        assert counts[0] < counts[1]  # the verifier needs more: before, only the drafter's were counted
        assert llm.get_num_tokens_from_messages(trimmed) == max(counts) <= limit

        text = "Tom walked to the park."
        assert llm.get_num_tokens(text) == max(len(m.text_prompt_ids(text)) for m in members)
        drafter = members[0].tokenizer(text, add_special_tokens=False)["input_ids"]
        assert llm.get_token_ids(text) == list(drafter)  # the drafter's ids, as before
        llm.close()


def test_the_count_is_each_members_largest_and_grows_with_the_history() -> None:
    members = [toy_member("lc-count-bpe", "byte_level", "llama", 0), toy_member("lc-count-sp", "metaspace", "llama", 1)]
    with registered_members(members) as names:
        llm = ChatEnsemble(models=names, max_tokens=MAX_TOKENS)
        one = [HumanMessage("Tom walked to the park. " * 5)]
        drafter, verifier = (len(m.prompt_ids(to_engine_messages(one))) for m in members)
        assert llm.get_num_tokens_from_messages(one) == verifier > drafter
        assert llm.get_num_tokens_from_messages([*one, AIMessage("ok"), *one]) > llm.get_num_tokens_from_messages(one)
        assert llm.get_num_tokens_from_messages([]) == 0 == llm.get_num_tokens("")
        llm.close()
