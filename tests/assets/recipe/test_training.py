"""assets/recipe/training.py: the recipe's training section (stages merge over the one before and validate as the trainer
does; their launch settings), and the mixing section's schedule."""

import pytest
from dagster import AssetKey

from assets.cli import main
from assets.recipe import DEMO_RECIPE, RecipeError, load_recipe
from tests.assets.test_recipe import write_recipe


def test_demo_stages_merge_over_the_stage_they_start_from():
    recipe = load_recipe(DEMO_RECIPE)
    stages = dict(recipe.training.run_configs())
    assert list(stages) == ["main", "long_512", "anneal"]
    main_cfg, long_cfg, anneal = stages["main"], stages["long_512"], stages["anneal"]
    # Both continue main's run: the long-context stage at a low LR after its own short warmup, the anneal as
    # the decay of main's WSD schedule (main is its warmup and stable phase: no decay of its own).
    assert recipe.training.starts() == {"long_512": ("continue_from", "main"), "anneal": ("continue_from", "main")}
    assert (main_cfg.schedule.kind, main_cfg.schedule.decay_fraction) == ("wsd", 0.0)
    # The long-context stage changes only what it says: sequence length, RoPE base, batch, LR and schedule.
    assert (long_cfg.batch.seq_len, long_cfg.model.rope_base) == (512, 100000.0)
    assert long_cfg.model.d_model == main_cfg.model.d_model and (main_cfg.optim.lr, long_cfg.optim.lr) == (2.0e-3, 2.0e-4)
    assert long_cfg.optim.betas == main_cfg.optim.betas and long_cfg.schedule.warmup_tokens == 8192
    assert main_cfg.batch.ramp_start == 8 and long_cfg.batch.ramp_start is None
    # The anneal merges over main (not over the long-context stage before it in the list) and decays to zero.
    assert anneal.batch == main_cfg.batch and anneal.model == main_cfg.model and anneal.optim == main_cfg.optim
    assert (anneal.schedule.kind, anneal.schedule.warmup_tokens, anneal.schedule.decay_fraction,
            anneal.schedule.min_lr_ratio) == ("wsd", 0, 1.0, 0)
    assert recipe.training.anneal.weights == {"books": 0.4, "math": 0.3, "code": 0.3}
    assert recipe.mixing.engine_config().candidates == 4


def test_stages_as_one_list_with_a_mid_training_stage(tmp_path):
    def mid_training(raw):
        training = raw["training"]
        long, anneal = training.pop("long_context")[0], training.pop("anneal")
        training["stages"] = [
            {"name": "mid_quality", "continue_from": "main", "train_tokens": 32768,
             "weights": {"books": 0.3, "math": 0.2, "code": 0.2, "web": 0.3}},
            {**long, "continue_from": "mid_quality"},
            {**anneal, "name": "anneal", "continue_from": "mid_quality"},
            {"name": "sft_like", "init_from": "anneal", "train_tokens": 4096, "optim": {"lr": 1.0e-4}},
        ]

    recipe = load_recipe(write_recipe(tmp_path, mid_training))
    stages = dict(recipe.training.run_configs())
    assert list(stages) == ["main", "mid_quality", "long_512", "anneal", "sft_like"]
    assert recipe.training.starts() == {"mid_quality": ("continue_from", "main"),
                                        "long_512": ("continue_from", "mid_quality"),
                                        "anneal": ("continue_from", "mid_quality"),
                                        "sft_like": ("init_from", "anneal")}
    assert stages["sft_like"].schedule.decay_fraction == 1.0 and stages["sft_like"].optim.lr == 1.0e-4
    assert recipe.training.stage("mid_quality").weights["web"] == 0.3

    from assets.definitions import build_defs

    graph = build_defs(recipe).resolve_asset_graph()
    parents = {name: {k.to_user_string() for k in graph.get(AssetKey(["training", name])).parent_keys
                      if k.path[0] == "training"} for name in stages}
    assert parents == {"main": set(), "mid_quality": {"training/main"}, "long_512": {"training/mid_quality"},
                       "anneal": {"training/mid_quality"}, "sft_like": {"training/anneal"}}


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda raw: raw["training"]["main"]["model"].update(n_heads=3),
         "training.main.model.d_model (128) must be divisible by model.n_heads (3)"),
        (lambda raw: raw["training"]["long_context"][0]["batch"].update(seq_len=0),
         "training.long_context[0] (long_512).batch.seq_len must be >= 1"),
        (lambda raw: raw["training"]["anneal"].update(learning_rate=1.0),
         "training.anneal.learning_rate: not a stage field"),
        (lambda raw: raw["mixing"]["prior"].update(wiki=0.1), "mixing.prior names a source the recipe does not have: wiki"),
        (lambda raw: raw["mixing"].update(target="wiki"), "target must be 'average' or one of"),
        (lambda raw: raw["training"]["anneal"]["weights"].update(wiki=1.0),
         "training.anneal.weights names a source the recipe does not have: wiki"),
        (lambda raw: raw["training"]["anneal"].update(continue_from="long_1k"),
         "training.anneal.continue_from: 'long_1k' is not an earlier stage (main, long_512)"),
        (lambda raw: raw["training"]["anneal"].update(init_from="main"), "stage anneal: give continue_from or init_from"),
        (lambda raw: raw["training"].update(stages=[{"name": "mid", "train_tokens": 1}]),
         "give the stages after main as one list (training.stages) or as training.long_context and training.anneal"),
        (lambda raw: raw["training"]["long_context"][0].update(name="main"),
         "training.long_context[0] (main).name: 'main' is taken"),
    ],
)
def test_a_bad_stage_names_the_stage_and_field(tmp_path, mutate, expected):
    with pytest.raises(RecipeError) as err:
        load_recipe(write_recipe(tmp_path, mutate))
    assert expected in str(err.value) and "recipe.yaml" in str(err.value)


def test_pretrain_plan_prints_every_stage_of_the_recipe(capsys, tmp_path):
    assert main(["plan", "--recipe", str(DEMO_RECIPE)]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("stage ")] == [
        "stage main", "stage long_512", "stage anneal"]
    assert "T = 512" in out and "2.621e+05" in out
    no_training = write_recipe(tmp_path, lambda raw: raw.pop("training") and raw.pop("ablation"))
    assert main(["plan", "--recipe", no_training]) == 2
    assert "has no training section" in capsys.readouterr().err


def test_the_sweep_has_its_schedule_and_the_sensor_that_keeps_it_going():
    from dagster import AssetKey

    from assets.definitions import build_defs

    recipe = load_recipe(DEMO_RECIPE)
    defs = build_defs(recipe)
    schedule = defs.resolve_schedule_def("mix_sweep_schedule")
    assert schedule.cron_schedule == "0 3 * * 0" and schedule.default_status.value == "STOPPED"
    sensor = defs.resolve_sensor_def("mix_sweep_sensor")  # what each tick drives (tests/assets/mixing/test_schedule.py)
    assert sensor.default_status.value == "STOPPED"
    assert sorted(job.name for job in sensor.jobs) == ["mix_sweep_job", "mixture_weights_job"]
    graph = defs.resolve_asset_graph()
    for key in (["mixing", "mix_sweep"], ["mixing", "mixture_weights"]):  # the sensor, not the automation sensor
        assert graph.get(AssetKey(key)).automation_condition is None


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda raw: raw["training"]["main"].update(launch={"launcher": "torchrun", "nproc_per_node": 0}),
         "training.main.launch.nproc_per_node: Input should be greater than or equal to 1 (got 0)"),
        (lambda raw: raw["training"]["long_context"][0].update(launch={"launcher": "mpirun"}),
         "training.long_context[0] (long_512).launch.launcher: Input should be 'python', 'torchrun'"),
        (lambda raw: raw["training"]["anneal"].update(launch={"procs": 2}),
         "training.anneal.launch.procs: not a launch field (launch sets launcher, nproc_per_node, nnodes, threads, "
         "max_restarts, restart_window_hours, slurm)"),
        (lambda raw: raw["training"]["main"].update(launch={"launcher": "slurm", "slurm": {"partiton": "gpu"}}),
         "training.main.launch.slurm: partiton: not a slurm field (slurm sets partition, time"),
        (lambda raw: raw["training"]["main"].update(launch={"launcher": "python", "nproc_per_node": 2}),
         "training.main.launch.nproc_per_node: launcher 'python' runs one process"),
        (lambda raw: raw["training"]["main"].update(launch={"max_restarts": -1}),
         "training.main.launch.max_restarts: Input should be greater than or equal to 0"),
        (lambda raw: raw["mixing"]["proxy"].update(launch="torchrun"), "mixing.proxy.launch: must be a mapping"),
    ],
)
def test_a_bad_launch_setting_names_the_stage_and_field(tmp_path, mutate, expected):
    with pytest.raises(RecipeError) as err:
        load_recipe(write_recipe(tmp_path, mutate))
    assert expected in str(err.value) and "recipe.yaml" in str(err.value)


def test_a_stages_launch_settings_reach_its_trainer_command_and_leave_its_version_alone(tmp_path, monkeypatch):
    from dagster import AssetKey

    from assets.definitions import build_defs
    from resources.launcher import LauncherResource

    def launch_and_versions(mutate):
        defs = build_defs(load_recipe(write_recipe(tmp_path, mutate)))
        graph = defs.resolve_asset_graph()
        nodes = {k: graph.get(AssetKey(k.split("/"))) for k in
                 ("training/main", "training/long_512", "training/anneal", "mixing/mix_sweep")}
        return ({k: n.metadata["launch"].value for k, n in nodes.items()},
                {k: n.code_version for k, n in nodes.items()})

    def two_ranks(raw):
        raw["training"]["main"]["launch"] = {"launcher": "torchrun", "nproc_per_node": 2, "max_restarts": 1}
        raw["training"]["anneal"]["launch"] = {"nproc_per_node": 1}  # merged over the stage before, like any field
        raw["mixing"]["proxy"]["launch"] = {"launcher": "python", "nproc_per_node": 1}

    def nothing(raw):
        raw["training"]["main"].pop("launch", None)

    launch, versions = launch_and_versions(two_ranks)
    main_launch = {"launcher": "torchrun", "nproc_per_node": 2, "max_restarts": 1}
    assert launch == {"training/main": main_launch, "training/long_512": main_launch,
                      "training/anneal": {**main_launch, "nproc_per_node": 1},
                      # a proxy's fixed thread count, given or not (assets/recipe/training.py PROXY_THREADS)
                      "mixing/mix_sweep": {"launcher": "python", "nproc_per_node": 1, "threads": 1, "max_restarts": 1}}
    # How the processes start is not what the stage makes: the same code versions as with no launch at all.
    assert launch_and_versions(nothing) == ({**{k: {} for k in launch}, "mixing/mix_sweep": {"threads": 1}}, versions)
    # The launcher gives the trainer its threads: the environment's OMP_NUM_THREADS, whatever else runs.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = {k: LauncherResource().with_settings(v).trainer_env().get("OMP_NUM_THREADS") for k, v in launch.items()}
    assert threads == {"training/main": None, "training/long_512": None, "training/anneal": None, "mixing/mix_sweep": "1"}
    # Over the environment's default (one python process) the stage's settings make the command.
    run = tmp_path / "run.json"
    resource = LauncherResource(launcher="python", nproc_per_node=1)
    command = resource.with_settings(launch["training/main"]).command(run)
    assert command[1:] == ["--nproc_per_node", "2", "--standalone", "-m", "trainer", "--config", str(run)]
    assert resource.with_settings(launch["training/main"]).max_restarts == 1
    assert resource.with_settings(launch["mixing/mix_sweep"]).command(run)[1:3] == ["-m", "trainer"]


def test_a_stage_can_run_on_slurm_with_its_own_partition(tmp_path):
    """docs/deployment.md's example: launch: {launcher: slurm, nnodes: 4, slurm: {...}} validates and makes the batch job."""
    from assets.definitions import build_defs
    from resources.launcher import LauncherResource
    from resources.slurm import sbatch_options

    def on_slurm(raw):
        raw["training"]["main"]["launch"] = {"launcher": "slurm", "nnodes": 4, "nproc_per_node": 8, "slurm": {
            "partition": "gpu", "time": "12:00:00", "gpus_per_node": 8, "sbatch_args": ["--account=ml"]}}

    defs = build_defs(load_recipe(write_recipe(tmp_path, on_slurm)))
    from dagster import AssetKey

    launch = defs.resolve_asset_graph().get(AssetKey(["training", "main"])).metadata["launch"].value
    launcher = LauncherResource().with_settings(launch)
    assert launcher.command(tmp_path / "run.json")[0] == "srun"  # the step the batch job runs
    command = sbatch_options(launcher.slurm, launcher.nnodes)
    assert command[0] == "sbatch" and "--account=ml" in command
    for flag, value in [("--nodes", "4"), ("--partition", "gpu"), ("--time", "12:00:00"), ("--gpus-per-node", "8")]:
        assert command[command.index(flag) + 1] == value
