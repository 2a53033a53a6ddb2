"""The `robo-rl` argument parser: one sub-command per job, each dispatching to its module."""

from __future__ import annotations

import argparse

from robo_rl.cli.demos import cmd_demos, cmd_demos_convert
from robo_rl.cli.evaluate import cmd_compare, cmd_curves, cmd_eval
from robo_rl.cli.robot import cmd_deploy
from robo_rl.cli.steer import cmd_steer
from robo_rl.cli.tools import cmd_bench, cmd_checkpoint, cmd_info, cmd_vla
from robo_rl.cli.train import cmd_train


def _strengths(text: str) -> list[float]:
    """``--strengths 0,0.5,1`` -> [0.0, 0.5, 1.0] (argparse turns the error into one usage line)."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not 0 <= v < float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers >= 0, e.g. 0,0.5,1,2")
    return values


def _tau_arg(text: str) -> float | str:
    """``--tau``: a probability in [0, 1] or 'auto'."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability in [0, 1] or 'auto'") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability in [0, 1] or 'auto'")
    return value


def _add_train(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="train a policy from a YAML config")
    t.add_argument("config", nargs="?", help="YAML config, e.g. configs/quickstart.yaml")
    t.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.lr=3e-4 env.num_envs=4")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    t.add_argument("--dry-run", action="store_true", help="build env (1 env, CPU), policy (no weights) and algorithm, then stop")
    t.add_argument("--allow-large", action="store_true",
                   help="build models a checkpoint describes even above 100M parameters (resume, teacher)")
    t.add_argument("--json", action="store_true",
                   help="print the run's whole summary.json at the end instead of the short summary")
    t.set_defaults(fn=cmd_train)


def _add_eval(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("eval", help="evaluate a run or checkpoint (or a benchmark of it; or report benchmark results)")
    e.add_argument("checkpoint", nargs="?", help="run directory or checkpoints/step_* directory; with --benchmark also "
                   "'random' or 'expert' (reference policies: uniform actions, the simulator's scripted expert)")
    e.add_argument("--task", help="with --benchmark: the ManiSkill task of a reference policy (default PickCube-v1), or "
                        "SUITE/INDEX (e.g. libero_object/3) for one task of a LIBERO suite")
    e.add_argument("--benchmark", help="named benchmark (libero-spatial, maniskill-vision, ...): results JSON to --out")
    e.add_argument("--out", help="results JSON: with --benchmark resumed if it holds finished blocks of the same "
                   "evaluation; otherwise the evaluation's JSON (what robo-rl compare reads)")
    e.add_argument("--report", metavar="RESULTS_JSON", nargs="+",
                   help="write a markdown + PNG report of benchmark results (one section per file)")
    e.add_argument("--compare", metavar="RESULTS_JSON", nargs="+",
                   help="a second policy's results side by side (with --report), or A.json B.json alone")
    e.add_argument("--report-out", metavar="MD", help="report path (default: the first results file with .md)")
    e.add_argument("--html", metavar="HTML", help="with --report: where the self-contained HTML page of the report "
                   "goes (charts, thumbnails and videos embedded; default: the markdown report's path with .html)")
    e.add_argument("--episodes", type=int, default=50)
    e.add_argument("--num-envs", type=int, default=0, help="parallel envs (default: the run's)")
    e.add_argument("--strengths", type=_strengths, default=[1.0],
                   help="with --benchmark: comma-separated multiples of the split's variations to sweep, e.g. 0,0.5,1,2")
    e.add_argument("--media", action="store_true", help="with --benchmark: thumbnails + video of a few episodes per task")
    e.add_argument("--block", type=int, default=10, help="with --benchmark: episodes per block (the unit of resumption)")
    e.add_argument("--seed", type=int, default=10_000)
    e.add_argument("--stochastic", action="store_true", help="sample actions instead of the mean (with --benchmark too)")
    e.add_argument("--device", default="cpu", help="where the policy runs: cpu, cuda or cuda:N (the envs stay where "
                   "their config puts them)")
    e.add_argument("--video", help="mp4 path (default: <run>/eval_<checkpoint>.mp4)")
    e.add_argument("--no-video", action="store_true")
    e.add_argument("--via-ros", metavar="ROBOT_YAML", help="evaluate through the ROS 2 bridge against the simulated robot process")
    e.add_argument("overrides", nargs="*", help="env.key=value / policy.key=value overrides of the checkpoint's config, "
                   "e.g. an OOD variation or a pi0 sampler setting (policy.noise_level=0 with --stochastic); with "
                   "--benchmark where the envs run (env.gl=egl, env.render_gpu, env.envs_per_worker, ...) and how "
                   "the policy acts (policy.sampler=ode with --stochastic: ODE from sampled noise)")
    e.add_argument("--allow-large", action="store_true",
                   help="build the checkpoint's model even above 100M parameters")
    e.set_defaults(fn=cmd_eval)


def _add_checkpoint(sub: argparse._SubParsersAction) -> None:
    ck = sub.add_parser("checkpoint", help="checkpoint utilities")
    cksub = ck.add_subparsers(dest="checkpoint_command", required=True)
    up = cksub.add_parser("upgrade", help="convert a run's pickled trainer.pt (older robo-rl) to trainer."
                                          "safetensors + trainer.json, loading only the types robo-rl wrote")
    up.add_argument("run", metavar="RUN",
                    help="run directory (every checkpoint) or one checkpoints/step_* directory")
    up.set_defaults(fn=cmd_checkpoint)


def _add_info(sub: argparse._SubParsersAction) -> None:
    i = sub.add_parser("info", help="what is registered and which simulator backends work here")
    i.add_argument("--json", action="store_true")
    i.set_defaults(fn=cmd_info)


def _add_demos(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("demos", help="expert demonstrations")
    dsub = d.add_subparsers(dest="demos_command", required=True)
    g = dsub.add_parser("generate", help="record expert demonstrations (ManiSkill motion planning, LIBERO scripted) to a robo-rl episodes file")
    g.add_argument("--sim", choices=["maniskill", "libero"], default="maniskill")
    g.add_argument("--task", default="PickCube-v1", help="ManiSkill env id, or LIBERO suite/task_index (libero_object/0)")
    g.add_argument("--episodes", type=int, default=100)
    g.add_argument("--out", required=True, help="output .h5 file")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--obs-mode", choices=["state", "rgb"], default="state")
    g.add_argument("--image-size", type=int, default=128)
    g.add_argument("--only-success", action="store_true", help="drop failed expert attempts")
    g.add_argument("--workers", type=int, default=1,
                   help="ManiSkill: expert processes in parallel (same episodes, in seed order, as one)")
    g.add_argument("--expert", choices=["planner", "scripted"], default="planner",
                   help="ManiSkill: mplib motion planner (pd_joint_pos actions) or the scripted closed-loop "
                        "end-effector expert (pd_ee_delta_pos; PickCube-v1, PushCube-v1)")
    g.add_argument("--noise", type=float, default=0.0,
                   help="scripted expert: std of Gaussian noise on the executed arm action (labels stay clean)")
    g.add_argument("--max-steps", type=int, default=50, help="scripted expert: step budget per episode")
    g.add_argument("--robot", default=None,
                   help="ManiSkill robot_uids instead of the task's robot (e.g. panda_wristcam: a wrist camera too); "
                        "train with env.extra.robot_uids set the same")
    g.add_argument("--fast-render", action="store_true",
                   help="LIBERO: record with env.fast_render's cheaper images (no shadows/reflections); "
                        "train and evaluate with env.fast_render: true")
    g.add_argument("--init-states", choices=["sampled", "official"], default="sampled",
                   help="LIBERO: fresh layouts from the task's placement regions (default: demonstrations apart "
                        "from the evaluation states) or the official evaluation init states")
    g.add_argument("--frame-every", type=int, default=1, metavar="K",
                   help="LIBERO: render and record the cameras at every K-th step only (state and actions at every "
                        "step; SFT trains on the recorded frames): ~K x fewer renders, the cost of a LIBERO demo")
    g.set_defaults(fn=cmd_demos)
    c = dsub.add_parser("convert", help="convert a demos file's actions to another control mode (exact, or "
                                        "an error), or rosbag2 recordings (deploy --record, ros2 bag record) "
                                        "to episodes")
    c.add_argument("src", nargs="+", help="one robo-rl episodes .h5 file, or rosbag2 recordings (bag "
                                          "directories or .mcap/.db3 files): each bag one episode")
    c.add_argument("--control-mode", choices=["pd_joint_delta_pos"],
                   help="episodes file: the target control mode")
    c.add_argument("--out", required=True, help="output .h5 file (for recordings: a new path)")
    c.add_argument("--drop-unconvertible", action="store_true",
                   help="leave out episodes with a step the target controller cannot make (counted in the output)")
    c.add_argument("--robot", help="recordings: the robot config (topics, joints, cameras, action_mode)")
    c.add_argument("--split-gap", type=float, metavar="SECONDS",
                   help="recordings: a new episode where no command was sent for longer than this")
    c.add_argument("--keep-holds", action="store_true",
                   help="recordings: keep the steps the safety filter held (default: dropped)")
    c.add_argument("--success", action="store_true",
                   help="recordings: mark every episode successful (default: unknown, stored as not)")
    c.set_defaults(fn=cmd_demos_convert)


def _add_deploy(sub: argparse._SubParsersAction) -> None:
    dp = sub.add_parser("deploy", help="serve a trained policy on a ROS 2 robot (safety-filtered)")
    dp.add_argument("checkpoint", help="run directory or checkpoints/step_* directory")
    dp.add_argument("--robot", required=True, help="robot config, e.g. configs/robots/panda_sim.yaml")
    dp.add_argument("--transport", choices=["auto", "rclpy", "cyclonedds", "inprocess"], default=None,
                    help="override the robot config's transport")
    dp.add_argument("--seconds", type=float, default=None,
                    help="stop after this long (default: until Ctrl-C or SIGTERM; a second one exits at once)")
    dp.add_argument("--record", default=None, metavar="DIR",
                    help="record inputs, commands and interventions into this new rosbag2 (mcap) directory")
    dp.add_argument("--managed", action="store_true",
                    help="rclpy: wait for a lifecycle manager's configure/activate (default: do both at start)")
    dp.add_argument("--ros-args", dest="ros_args", nargs=argparse.REMAINDER, default=None,
                    help="rclpy arguments that follow, e.g. --ros-args -p control_rate_hz:=20.0 -r __node:=arm_policy")
    dp.add_argument("--allow-large", action="store_true",
                    help="build the checkpoint's model even above 100M parameters")
    dp.set_defaults(fn=cmd_deploy)


def _add_vla(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("vla", help="VLA model utilities")
    vsub = v.add_subparsers(dest="vla_command", required=True)
    bm = vsub.add_parser("build-mini", help="assemble the mini OpenVLA-style model (SmolLM2-135M + MobileNetV2) offline")
    bm.add_argument("--out", default=".models/openvla-mini", help="output directory")
    bm.add_argument("--image-size", type=int, default=128)
    bm.add_argument("--action-dim", type=int, default=8, help="action dims (8 = Panda pd_joint_pos / pd_joint_delta_pos)")
    bm.add_argument("--llm-layers", type=int, default=4, help="keep the first N of SmolLM2's 30 layers (4: CPU-sized; 30: all)")
    bm.set_defaults(fn=cmd_vla)


def _add_steer(sub: argparse._SubParsersAction) -> None:
    st = sub.add_parser("steer", help="RL^2 latent steering of a flow (pi0) policy: collect logs, fit, evaluate")
    ssub = st.add_subparsers(dest="steer_command", required=True)
    sc = ssub.add_parser("collect", help="roll out the frozen base policy and log chunks, returns and failures")
    sc.add_argument("checkpoint", help="run directory or checkpoint of a pi0 policy")
    sc.add_argument("--episodes", type=int, default=100)
    sc.add_argument("--out", required=True, help="output .npz log")
    sc.add_argument("--explore", type=float, default=0.0,
                    help="std of an action offset in normalized units added to the base's actions (0: the base as is)")
    sc.add_argument("--explore-per", choices=["episode", "call"], default="episode",
                    help="hold the --explore offset for a whole episode (default) or redraw it every call")
    sf = ssub.add_parser("fit", help="train the latent velocity head and the failure predictor on a log")
    sf.add_argument("checkpoint")
    sf.add_argument("--log", required=True, nargs="+", help="one or more logs from 'steer collect' (pooled)")
    sf.add_argument("--out", required=True, help="output steering directory")
    sf.add_argument("--fail-log", nargs="+", default=None,
                    help="train the failure predictor (and --tau auto) on these logs instead of --log, e.g. the base's "
                         "own rollouts when --log holds exploring ones")
    sf.add_argument("--steps", type=int, default=500)
    sf.add_argument("--beta", type=float, default=1.0)
    sf.add_argument("--tau", type=_tau_arg, default=0.5,
                    help="gate threshold on p_fail, or 'auto' (the held-out Youden-optimal threshold)")
    sf.add_argument("--gate", choices=["tau", "conformal"], default="tau",
                    help="tau: steer calls with p_fail > tau; conformal: steer from the first call whose running "
                         "failure score crosses a time-indexed conformal band (false alarms on successes <= --alpha)")
    sf.add_argument("--alpha", type=float, default=0.1,
                    help="with --gate conformal: the largest share of would-be successful episodes the gate may open on")
    sf.add_argument("--val-fraction", type=float, default=None,
                    help="share of episodes held out (default 0.2; 0.5 with --gate conformal: half calibrate, half test)")
    sf.add_argument("--advantage", choices=["value", "gae", "return"], default="value",
                    help="return-to-go minus a fitted value baseline (default), GAE(lambda) on that value, "
                         "or the standardized return-to-go")
    sf.add_argument("--returns", choices=["success", "dense"], default="success",
                    help="what the advantages rank: 1[episode succeeded] (default), or the logged dense return-to-go "
                         "(only where episodes do not end on success: there a dense return ranks success below failure)")
    sf.add_argument("--head", choices=["flow", "mean"], default="flow",
                    help="flow: velocity head on the action expert's latents (flow matching); mean: advantage shift of "
                         "the chunk's mean on the pooled prefix, applied as a constant velocity")
    sf.add_argument("--gae-lambda", type=float, default=0.9, help="GAE lambda of --advantage gae (1 = 'value', 0 = TD)")
    sf.add_argument("--temperature", type=float, default=1.0,
                    help="advantage temperature T of the weights exp(A / T) (advantages are standardized; lower = sharper)")
    sf.add_argument("--no-baseline", action="store_true",
                    help="one head fit to the logged chunks' flow (not only the advantage shift)")
    sf.add_argument("--two-heads", action="store_true",
                    help="fit h_w and h_1 as two nets (default: one net with a weighted/unweighted flag)")
    se = ssub.add_parser("eval", help="success of the base policy with steering gated / always on / off")
    se.add_argument("checkpoint")
    se.add_argument("--steering", required=True, help="a directory from 'steer fit'")
    se.add_argument("--samples", type=int, default=1,
                    help="composed samples per steered call; > 1: the fitted scorer executes the best (test-time scaling)")
    se.add_argument("--episodes", type=int, default=100)
    se.add_argument("--mode", choices=["gated", "always", "off"], default="gated",
                    help="gated: the fitted gate; always: steering on every call; off: the base alone, the fitted gate only watched "
                         "(gate_monitor: its false-alarm and detection rates on the base's own episodes)")
    se.add_argument("--tau", type=float, default=None, help="with --mode gated: the gate threshold (default: the fitted one)")
    se.add_argument("--beta", type=float, default=None,
                    help="steering scale (default: the fitted one; > 1 extrapolates the advantage shift, like guidance)")
    se.add_argument("--stochastic", action="store_true",
                    help="start each chunk from Gaussian noise (as deployed and as collected), seeded by --seed; "
                         "default: from x_0 = 0")
    se.add_argument("--out", help="also write the evaluation JSON here (atomically), for 'robo-rl compare'")
    so = ssub.add_parser("online", help="fine-tune a steering head in the environment (VLA frozen, gate in the loop)")
    so.add_argument("checkpoint")
    so.add_argument("--steering", required=True, help="a directory from 'steer fit' (the head to start from)")
    so.add_argument("--out", required=True, help="output steering directory")
    so.add_argument("--iterations", type=int, default=10)
    so.add_argument("--episodes", type=int, default=8, help="whole episodes per iteration")
    so.add_argument("--lr", type=float, default=1e-4)
    so.add_argument("--epochs", type=int, default=2)
    so.add_argument("--clip", type=float, default=0.2)
    so.add_argument("--noise-level", type=float, default=0.5, help="Flow-SDE noise level of the rollouts")
    so.add_argument("--tau", type=float, default=None, help="the tau gate's threshold (default: the fitted one)")
    so.add_argument("--beta", type=float, default=None,
                    help="steering scale of the rollouts and of the saved head (default: the fitted one)")
    for q in (sc, se, so):
        q.add_argument("--num-envs", type=int, default=None)
        q.add_argument("--seed", type=int, default=None)
        q.add_argument("overrides", nargs="*", help="env.key=value overrides (e.g. an OOD variation)")
    for q in (sc, sf, se, so):
        q.set_defaults(fn=cmd_steer)
    for sp in (sc, sf, se, so):
        sp.add_argument("--allow-large", action="store_true",
                        help="build the checkpoint's model even above 100M parameters")


def _add_curves(sub: argparse._SubParsersAction) -> None:
    cv = sub.add_parser("curves", help="compare seed groups of runs: binned learning curves with min-max bands")
    cv.add_argument("--group", action="append", required=True, help="LABEL=RUN_DIR[,RUN_DIR...] (repeat per group)")
    cv.add_argument("--metric", default="train/success_rate")
    cv.add_argument("--bin", type=int, default=10_000, help="env steps per bin")
    cv.add_argument("--reach", type=float, default=None, metavar="VALUE",
                    help="also print when each run first reaches VALUE (e.g. 0.9 x a teacher's success): env steps "
                         "and wall-clock minutes, the metric averaged over the last --window logged rows")
    cv.add_argument("--window", type=int, default=3, help="rows averaged for --reach (default 3)")
    cv.add_argument("--out", default="curves.png")
    cv.set_defaults(fn=cmd_curves)


def _add_compare(sub: argparse._SubParsersAction) -> None:
    cp = sub.add_parser("compare", help="paired success difference of two evaluations on the same starts "
                                        "(JSON from 'eval' / 'steer eval' with the same seeds and --num-envs)")
    cp.add_argument("--a", nargs="+", required=True, help="evaluation JSON file(s) of policy A (several: concatenated), "
                    "or run directories (their final evaluation)")
    cp.add_argument("--b", nargs="+", required=True, help="the matching file(s) of policy B, in the same order")
    cp.set_defaults(fn=cmd_compare)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="benchmarks: ppo (ours vs SB3), env (VecEnv overhead), decode (VLA batch decoding), "
                                     "sample (pi0 chunk sampling), ros (ROS 2 node latency), rollout (serial vs pipelined), "
                                     "scale (VLA-driven env batch: steps/s, GPU utilization), chunks (blind chunk steps vs "
                                     "rendering every step), sil (GRPO self-imitation: one prefix pass vs two)")
    b.add_argument("name", help="ppo | env | decode | sample | ros | rollout | scale | chunks | sil")
    b.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the benchmark (see --help)")
    b.set_defaults(fn=cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="robo-rl", description="RL post-training of robot policies.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    _add_train(sub)
    _add_eval(sub)
    _add_checkpoint(sub)
    _add_info(sub)
    _add_demos(sub)
    _add_deploy(sub)
    _add_vla(sub)
    _add_steer(sub)
    _add_curves(sub)
    _add_compare(sub)
    _add_bench(sub)
    return p

