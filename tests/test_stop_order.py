"""Two stop strings completed by the same token cut at the earlier one whatever their order (it cut
at the first in list order, then searched the next only in the cut text: ' of' kept part of ' offi')."""
from shared_engine import EnsembleEngine
from tests.toy import toy_member


def test_stop_order_does_not_change_the_cut() -> None:
    members = [toy_member("so-a", "byte_level", "llama", 1), toy_member("so-b", "metaspace", "gpt2", 2)]
    eng = EnsembleEngine(members, method="safe", max_new_tokens=40)
    one = eng.generate("x = 3", temperature=0.9, seed=3, stop=["fice", " offi"]).text
    other = eng.generate("x = 3", temperature=0.9, seed=3, stop=[" offi", "fice"]).text
    assert one == other == eng.generate("x = 3", temperature=0.9, seed=3, stop=[" offi"]).text


def test_every_surface_names_the_stop_string_that_ended_the_answer() -> None:
    """The engine's finish names the request's stop string that cut the answer (vLLM's stop_reason);
    LangChain's response_metadata, LlamaIndex's additional_kwargs and the server's ensemble field carry it."""
    import httpx

    from langchain_ensemble import ChatEnsemble
    from llamaindex_ensemble import EnsembleLLM
    from shared_engine.server import create_app
    from shared_engine.server.background import serve_in_background
    from tests.toy import registered_members

    members = [toy_member("so-c", "byte_level", "llama", 1), toy_member("so-d", "metaspace", "gpt2", 2)]
    eng = EnsembleEngine(members, method="safe", max_new_tokens=24)
    whole = eng.generate("x = 3")
    stop = whole.text[6:9]
    assert whole.stop_string is None and len(stop) == 3
    cut = eng.generate("x = 3", stop=[stop, "never written"])
    assert cut.stop_string == stop and cut.finish_reason == "stop" and not cut.text.endswith(stop)
    with registered_members(members) as names:
        message = ChatEnsemble(models=names, max_tokens=24, temperature=0.0).invoke("x = 3", stop=[stop])
        assert message.response_metadata["stop_string"] == stop
        assert "stop_string" not in ChatEnsemble(models=names, max_tokens=4).invoke("x = 3").response_metadata
        response = EnsembleLLM(models=names, max_tokens=24).complete("x = 3", stop=[stop])
        assert response.additional_kwargs["stop_string"] == stop
    with serve_in_background(create_app(eng)) as url:
        body = {"model": "safe-ensemble", "messages": [{"role": "user", "content": "x = 3"}], "stop": [stop]}
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
        assert answer["ensemble"]["stop_string"] == stop
