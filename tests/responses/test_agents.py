"""The OpenAI Agents SDK (`openai-agents`) through svir: an agent whose model is a Responses model
(`OpenAIResponsesModel`, the SDK's default kind) on a client pointed at svir in process runs its
function tool and comes to its final output. Tracing is off: nothing is exported."""

from __future__ import annotations

from pathlib import Path

from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tests.anthropic.agent_model import FINAL
from tests.responses.support import ARGUMENTS, CONFIG, TOOL, Upstream
from tests.support.inprocess import serve


async def test_an_agent_with_a_function_tool_runs_to_its_final_output(tmp_path: Path) -> None:
    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool(name_override=TOOL)
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"sunny in {city}"

    upstream = Upstream()
    async with serve(tmp_path, CONFIG, upstream) as svir:
        model = OpenAIResponsesModel(model="up/agent", openai_client=svir.client)
        agent = Agent(
            name="weather",
            instructions="Answer with the weather tool.",
            tools=[get_weather],
            model=model,
            model_settings=ModelSettings(temperature=0),
        )
        result = await Runner.run(
            agent, "What is the weather in Paris?", run_config=RunConfig(tracing_disabled=True)
        )
    assert asked == [ARGUMENTS["city"]]
    assert result.final_output == f"{FINAL} sunny in Paris"
    first, second = upstream.agent.bodies()
    assert first["messages"][0] == {"role": "system", "content": "Answer with the weather tool."}
    assert [t["function"]["name"] for t in first["tools"]] == [TOOL]
    last = second["messages"][-1]
    assert last["role"] == "tool" and last["content"] == "sunny in Paris"
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == TOOL
