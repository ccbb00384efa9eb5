"""Copy The Convergence 0.1.8's shipped example configs and its template generator's output
into services/optimizer/tests/convergence_configs/ (the test set for "Flywheel reads every
config The Convergence accepts").

    python scripts/convergence_configs.py                # downloads the wheel with pip
    python scripts/convergence_configs.py --wheel PATH   # or uses one already here

What is copied: the 7 example YAMLs under examples/ (openai, groq, azure_multi_model,
browserbase, agno discord/gmail/reddit) with the test-case JSON files they name, and the
configs the generator's templates write (llm_chat for OpenAI and for Groq, azure_chat,
web_automation), made by calling each template class's generate_config /
generate_test_cases / generate_yaml_content the way its CustomTemplateGenerator does. Those
template modules need only PyYAML, so the package itself is not installed. (0.1.8's
generator also imports an agno_agent_template module the wheel does not ship, so its
custom generator cannot run at all; the agno agents are covered by the examples.)

The Convergence is Apache-2.0 (see the NOTICE file written next to the copies).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "0.1.8"
ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "services/optimizer/tests/convergence_configs"
EXAMPLES = {
    "openai": "examples/ai/openai/openai_optimization.yaml",
    "groq": "examples/ai/groq/groq_optimization.yaml",
    "azure_multi_model": "examples/ai/azure/azure_multi_model_optimization.yaml",
    "browserbase": "examples/web_browsing/browserbase/browserbase_optimization.yaml",
    "agno_discord": "examples/agno_agents/discord/discord_agent_optimization.yaml",
    "agno_gmail": "examples/agno_agents/gmail/gmail_agent_optimization.yaml",
    "agno_reddit": "examples/agno_agents/reddit/reddit_agent_optimization.yaml",
}
NOTICE = f"""Files under examples/ are copied unchanged from the PyPI wheel the-convergence=={VERSION}
(https://github.com/persist-os/the-convergence), Apache License 2.0, Copyright its authors.
Files under templates/ are what that wheel's template generator
(convergence/generator/templates/*.py) writes. Regenerate both with:

    python scripts/convergence_configs.py

They are the test set of services/optimizer/tests/test_convergence_configs.py.
"""


def _wheel(path: str | None, tmp: Path) -> Path:
    if path:
        return Path(path)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", f"the-convergence=={VERSION}", "-d", str(tmp)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return next(tmp.glob("the_convergence-*.whl"))


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _copy_examples(src: Path) -> None:
    for name, rel in EXAMPLES.items():
        folder = OUT / "examples" / name
        folder.mkdir(parents=True, exist_ok=True)
        yaml_path = src / rel
        shutil.copy(yaml_path, folder / yaml_path.name)
        for tests in yaml_path.parent.glob("*.json"):  # the test cases it names (path: relative)
            shutil.copy(tests, folder / tests.name)


def _write_templates(src: Path) -> None:
    templates = src / "convergence/generator/templates"
    llm = _module(templates / "llm_chat_template.py", "conv_llm_chat").LLMChatTemplate()
    azure = _module(templates / "azure_chat_template.py", "conv_azure_chat").AzureChatTemplate()
    web = _module(templates / "web_automation_template.py", "conv_web").WebAutomationTemplate()
    description = "customer support chatbot answering questions"
    made = {
        "llm_chat_openai": (
            llm,
            llm.generate_config("https://api.openai.com/v1/chat/completions", "OPENAI_API_KEY", description),
        ),
        "llm_chat_groq": (
            llm,
            llm.generate_config(
                "https://api.groq.com/openai/v1/chat/completions",
                "GROQ_API_KEY",
                description,
                provider_name="groq",
                models=["llama-3.1-8b-instant", "llama-3.3-70b-versatile"],
            ),
        ),
        "azure_chat": (
            azure,
            azure.generate_config(
                {
                    "gpt-4o": "https://your-resource.openai.azure.com/openai/deployments/gpt-4o/chat/completions"
                    "?api-version=2025-01-01-preview",
                    "gpt-4o-mini": "https://your-resource.openai.azure.com/openai/deployments/gpt-4o-mini/chat/"
                    "completions?api-version=2025-01-01-preview",
                },
                "AZURE_API_KEY",
                description,
            ),
        ),
        "web_automation": (
            web,
            web.generate_config("https://api.browserbase.com/v1/sessions", "BROWSERBASE_API_KEY", "scrape pages"),
        ),
    }
    for name, (template, config) in made.items():
        folder = OUT / "templates" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "optimization.yaml").write_text(template.generate_yaml_content(config))
        cases = template.generate_test_cases(description if name != "web_automation" else "scrape pages")
        (folder / "test_cases.json").write_text(template.generate_json_content(cases))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", help=f"the-convergence {VERSION} wheel (default: pip download it)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _wheel(args.wheel, Path(tmp))
        src = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(src)
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir(parents=True)
        _copy_examples(src)
        _write_templates(src)
        shutil.copy(next(src.glob("*.dist-info/licenses/LICENSE*")), OUT / "LICENSE")
    (OUT / "NOTICE").write_text(NOTICE)
    print(json.dumps(sorted(str(p.relative_to(OUT)) for p in OUT.rglob("*.yaml")), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
