"""The New run form in people's words (under AppTest, on the seeded database): each field's
label and help come from the schema, groups carry the schema's titles, the model and
dataset fields offer the data folder's models and datasets (uploads included), output_dir
defaults to the run's own folder in the data folder, and a preset says what it is for and
what it needs, with a button that generates its missing data."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app import auth, forms
from engine import paths
from engine.config import GROUP_TITLES, RunConfig, config_fields
from engine.data.local import default_output_dir
from engine.data.uploads import keep_upload
from engine.paths import resolve_path
from engine.presets import load_preset, preset_info
from tests.app.test_pages import MAIN, TIMEOUT, page


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project root of the test's own: what the form generates lands there."""
    monkeypatch.setattr(paths, "PROJECT_ROOT", tmp_path)
    monkeypatch.setenv("ESLAB_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


def values(at: AppTest) -> dict[str, object]:
    """What the form would submit, from the test's session."""
    names = [forms.key(s.name) for s in config_fields()]
    return forms.form_values({k: at.session_state[k] for k in names if k in at.session_state})


def widgets(at: AppTest) -> dict[str, object]:
    return {w.key: w for w in (*at.text_input, *at.selectbox, *at.checkbox) if w.key}


def test_every_field_has_its_label_its_option_name_and_its_help_from_the_schema(store):
    at = page("app_pages/new_run.py")
    assert not at.exception
    shown = widgets(at)
    for spec in config_fields():
        if "es" not in spec.methods:
            continue
        widget = shown[forms.key(spec.name)]
        assert widget.label == f"{spec.label} `{spec.name}`" + (" *" if spec.required else "")
        assert widget.help == spec.help
    # the form's groups, in order (the upload panel's expander above them is no group)
    titles = [e.proto.label for e in at.get("expander") if not e.proto.label.startswith("Upload")]
    assert titles == [t for g, t in GROUP_TITLES.items() if g != "lbes"]  # lbes: not for es
    assert "Alignment" in titles and "alignment" not in titles


def test_the_model_and_dataset_fields_offer_the_data_folder(store, data_folder, dataset):
    upload = keep_upload(dataset.read_bytes(), "mine.parquet").path
    at = page("app_pages/new_run.py")
    # named data/... as a configuration names them: data/ is the data folder, wherever it is
    assert "data/models/tiny" in at.selectbox(key="new_model").options
    for field in ("train_file", "eval_file"):
        offered = at.selectbox(key=forms.key(field)).options
        assert "data/task/train.parquet" in offered and f"data/uploads/{upload.name}" in offered
        assert not [o for o in offered if "/models/" in o]
    at.selectbox(key="new_eval_file").select(f"data/uploads/{upload.name}").run()
    assert resolve_path(str(values(at)["eval_file"])) == upload


def test_output_dir_defaults_to_the_runs_own_folder_and_follows_its_name(store, project):
    at = page("app_pages/new_run.py")
    name = at.text_input(key="new_run_name").value
    assert name.startswith("es-")
    assert at.text_input(key="new_output_dir").value == default_output_dir(name)
    assert default_output_dir(name) == f"data/runs/{name}"  # in the data folder
    at.text_input(key="new_run_name").input("my run").run()
    assert at.text_input(key="new_output_dir").value == "data/runs/my-run"
    at.text_input(key="new_output_dir").input("data/runs/mine").run()
    at.text_input(key="new_run_name").input("renamed").run()
    assert at.text_input(key="new_output_dir").value == "data/runs/mine"  # typed: kept
    at.text_input(key="new_output_dir").input("").run()  # empty: the run's folder
    submitted = values(at)
    assert submitted["output_dir"] == "data/runs/renamed"
    reward = "engine.rewards.gsm8k.compute_score"
    config = RunConfig.from_flat(
        {**submitted, "train_file": "t.parquet", "reward_func_path": reward}
    )
    # the default passes the output_dir rules
    assert config.data.output_dir == "data/runs/renamed"


def test_a_preset_fills_the_form_and_says_what_it_is_for(store, project):
    (project / "data" / "models" / "smollm2-135m-instruct").mkdir(parents=True)
    at = page("app_pages/new_run.py")
    at.selectbox(key="new_preset").select("lbes-conciseness").run()
    assert not at.exception
    assert at.selectbox(key="new_method").value == "lbes"
    assert at.text_input(key="new_n").value == str(load_preset("lbes-conciseness").sampling.n)
    name = at.text_input(key="new_run_name").value
    assert name.startswith("lbes-conciseness-")
    assert at.text_input(key="new_output_dir").value == f"data/runs/{name}"  # not the preset's
    purpose = preset_info("lbes-conciseness").purpose
    assert any(purpose[:40] in m.value.replace("\\", "") for m in at.markdown)
    assert not at.warning  # it needs nothing, and its model is in the data folder


def test_a_preset_whose_model_is_not_in_the_data_folder_says_where_it_looked(store, project):
    at = page("app_pages/new_run.py")
    at.selectbox(key="new_preset").select("lbes-conciseness").run()
    where = project / "data" / "models" / "smollm2-135m-instruct"
    assert [w.value.replace("\\", "") for w in at.warning] == [
        f"Its model folder data/models/smollm2-135m-instruct is missing (looked for at {where})"
    ]


def test_a_countdown_preset_says_it_needs_a_larger_model_and_generates_its_data(store, project):
    at = page("app_pages/new_run.py")
    at.selectbox(key="new_preset").select("lbes-countdown").run()
    warnings = [w.value.replace("\\", "") for w in at.warning]
    assert any("Needs a larger model" in w and "Qwen/Qwen2.5-" in w for w in warnings)
    assert any("Generate its data first" in w for w in warnings)
    commands = [c.value for c in at.code if not c.value.startswith("curl ")]  # not the upload's
    assert commands == [preset_info("lbes-countdown").data_command]
    at.button(key="new_generate_data").click().run()
    assert not at.exception, at.exception
    assert (project / "data" / "countdown3" / "train.parquet").is_file()
    assert any("8192 train and 1024 test puzzles" in s.value for s in at.success)
    at.run()
    assert not [b for b in at.button if b.key == "new_generate_data"]  # the data is there


def test_a_viewer_cannot_generate_data(store, project, tmp_path, monkeypatch):
    users = tmp_path / "users.yaml"
    auth.add_user(users, "vi", "viewer", "viewer-pass")
    monkeypatch.setenv(auth.ENV, str(users))
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.session_state[auth.SESSION_KEY] = auth.signed_in(auth.load_users(users)["vi"])
    at.run()
    at = at.switch_page("app_pages/new_run.py").run()
    at.selectbox(key="new_preset").select("lbes-countdown").run()
    at.button(key="new_generate_data").click().run()
    assert any("only editors may generate datasets" in e.value for e in at.error)
    assert not (project / "data" / "countdown3").exists()
