"""The policy node as an rclpy lifecycle (managed) node, as ROS 2 tools expect it.

States: configure (apply ROS parameters over the robot config, load the policy, check its spaces
against the robot, create the subscriptions), activate (refused, naming what is missing, unless every
input is fresh; then start commanding; ``robo-rl deploy`` without ``--managed`` waits for the inputs
before it activates),
deactivate (one hold, stop commanding; subscriptions stay), cleanup (drop the subscriptions),
shutdown (the final safe command). Parameters (read at configure, so ``ros2 param set`` before
configure or ``--ros-args -p name:=value`` override the robot YAML): ``control_rate_hz``,
``joint_states_topic``, ``command_topic``, ``instruction_topic``, ``estop_topic``, ``state_topic``,
``camera_topics`` (one per configured camera, in order), ``startup_timeout_s``. Service
``~/reset_estop`` (std_srvs/Trigger) releases a latched e-stop when the inputs are fresh.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn
from std_srvs.srv import Trigger

from real_robot.config import RobotConfig
from real_robot.node import PolicyNode
from real_robot.transport.ros import RclpyTransport
from robo_rl.contracts import Policy
from robo_rl.errors import ConfigError, RoboRLError

log = logging.getLogger(__name__)

# policy loader: robot config (after parameters) -> (policy, state length the policy takes or None)
PolicyLoader = Callable[[RobotConfig], tuple[Policy, "int | None"]]
TOPIC_PARAMS = ("joint_states_topic", "command_topic", "instruction_topic", "estop_topic", "state_topic")


def apply_parameters(robot: RobotConfig, params: dict[str, Any]) -> RobotConfig:
    """The robot config with ROS parameter values put over it (re-validated; one-line ConfigError)."""
    for k, v in params.items():
        numeric = k in ("control_rate_hz", "startup_timeout_s")
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool)) if numeric else (
            all(isinstance(t, str) for t in v) if k == "camera_topics" else isinstance(v, str))
        if not ok:
            want = "a number" if numeric else "a list of topic names" if k == "camera_topics" else "a topic name"
            raise ConfigError(f"ROS parameter {k} = {v!r}; it must be {want}")
    changes: dict[str, Any] = {k: str(params[k]) for k in TOPIC_PARAMS if k in params}
    if "control_rate_hz" in params:
        rate = float(params["control_rate_hz"])
        changes["control_rate_hz"] = rate
        try:
            changes["safety"] = dataclasses.replace(robot.safety, control_rate_hz=rate)
        except ValueError as err:
            raise ConfigError(f"ROS parameter control_rate_hz: {err}") from None
    if "startup_timeout_s" in params:
        changes["startup_timeout_s"] = float(params["startup_timeout_s"])
    if "camera_topics" in params:
        topics = list(params["camera_topics"])
        if len(topics) != len(robot.cameras):
            raise ConfigError(f"ROS parameter camera_topics has {len(topics)} topic(s); robot '{robot.name}' "
                              f"configures {len(robot.cameras)} camera(s)")
        changes["cameras"] = tuple(dataclasses.replace(c, topic=t) for c, t in zip(robot.cameras, topics))
    try:
        return dataclasses.replace(robot, **changes)
    except ValueError as err:
        raise ConfigError(f"ROS parameters: {err}") from None


class LifecyclePolicyNode(LifecycleNode):
    """Hosts a ``PolicyNode`` on rclpy; spin it with a ``SingleThreadedExecutor`` in a thread of its own.
    No transition blocks on inputs (the executor thread delivers them): ``wait_inputs`` is for a caller
    outside the executor that configures and activates the node itself."""

    def __init__(self, robot: RobotConfig, load_policy: PolicyLoader, node_name: str = "robo_rl_policy",
                 recorder_factory: Callable[[RobotConfig], Any] | None = None,
                 on_shutdown: Callable[[], None] | None = None, **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        self.robot = robot
        self._load_policy = load_policy
        self._recorder_factory = recorder_factory
        self._on_shutdown_cb = on_shutdown
        self.recorder: Any = None
        self.policy_node: PolicyNode | None = None
        self.final_decision: Any = None
        self.last_error: str | None = None
        self._cancel = threading.Event()
        # dynamic typing: ``control_rate_hz:=20`` (an integer) is as good as 20.0; values are checked at configure
        any_type = ParameterDescriptor(dynamic_typing=True)
        for key in TOPIC_PARAMS:
            self.declare_parameter(key, getattr(robot, key), any_type)
        self.declare_parameter("control_rate_hz", float(robot.control_rate_hz), any_type)
        self.declare_parameter("startup_timeout_s", float(robot.startup_timeout_s), any_type)
        if robot.cameras:
            self.declare_parameter("camera_topics", [c.topic for c in robot.cameras], any_type)
        self.create_service(Trigger, "~/reset_estop", self._on_reset_estop)

    def _params(self) -> dict[str, Any]:
        names = [*TOPIC_PARAMS, "control_rate_hz", "startup_timeout_s"] + (["camera_topics"] if self.robot.cameras else [])
        return {n: self.get_parameter(n).value for n in names}

    # -- transitions ------------------------------------------------------------------------------
    def on_configure(self, state: Any) -> TransitionCallbackReturn:
        try:
            robot = apply_parameters(self.robot, self._params())
            policy, state_dim = self._load_policy(robot)
            self.recorder = self._recorder_factory(robot) if self._recorder_factory else None
            transport = RclpyTransport(node=self, spin=False)
            self.policy_node = PolicyNode(robot, policy, transport, recorder=self.recorder, state_dim=state_dim,
                                          node_name=self.get_name())
            self.policy_node.check_types()
        except (RoboRLError, OSError) as err:
            self.last_error = str(err)
            self.get_logger().error(f"configure failed: {err}")
            self._drop()
            return TransitionCallbackReturn.FAILURE
        self.get_logger().info(f"configured: robot '{robot.name}', {robot.control_rate_hz:g} Hz, "
                               f"commands on {robot.command_topic}")
        return TransitionCallbackReturn.SUCCESS

    def wait_inputs(self, timeout_s: float, cancel: threading.Event | None = None) -> None:
        """After configure, from a thread other than the executor's: block until every required input
        delivered a valid message (one-line ConfigError naming the missing ones after ``timeout_s``)."""
        if self.policy_node is None:
            raise ConfigError("the policy node is not configured")
        self.policy_node.wait_ready(timeout_s, cancel=cancel)

    def on_activate(self, state: Any) -> TransitionCallbackReturn:
        node = self.policy_node
        if node is None:
            return TransitionCallbackReturn.FAILURE
        try:
            node.wait_ready(0.0)
        except RoboRLError as err:
            self.last_error = f"{err}; activate again once they arrive"
            self.get_logger().error(f"activate failed: {err}")
            return TransitionCallbackReturn.FAILURE
        if self._cancel.is_set():
            return TransitionCallbackReturn.FAILURE
        node.start()
        self.get_logger().info("active: commanding")
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: Any) -> TransitionCallbackReturn:
        if self.policy_node is not None:
            self.final_decision = self.policy_node.pause()
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: Any) -> TransitionCallbackReturn:
        self._drop()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: Any) -> TransitionCallbackReturn:
        self._cancel.set()
        if self.policy_node is not None:
            self.final_decision = self.policy_node.stop()
            self.policy_node.flush()
        self._close_recorder()
        if self._on_shutdown_cb is not None:
            self._on_shutdown_cb()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: Any) -> TransitionCallbackReturn:
        if self.policy_node is not None:
            self.final_decision = self.policy_node.pause()
        return TransitionCallbackReturn.SUCCESS

    def _drop(self) -> None:
        if self.policy_node is not None:
            self.policy_node.stop()
        self.policy_node = None
        self._close_recorder()

    def _close_recorder(self) -> None:
        if self.recorder is not None:
            try:
                self.recorder.close()
            except Exception as err:  # a full disk must not stop the shutdown
                self.get_logger().error(f"closing the recording failed: {err}")
            self.recorder = None

    # -- services ---------------------------------------------------------------------------------
    def _on_reset_estop(self, request: Any, response: Any) -> Any:
        if self.policy_node is None:
            response.success, response.message = False, "not configured"
        else:
            response.success, response.message = self.policy_node.reset_estop()
        self.get_logger().warning(f"reset_estop: {response.message}")
        return response

    def summary(self) -> dict[str, Any]:
        n = self.policy_node
        if n is None:
            return {"commands_sent": 0, "interventions": {}, "rejected": {}, "missed_ticks": 0}
        return {"commands_sent": n.sent, "interventions": dict(n.safety.counts), "rejected": dict(n.rejected),
                "missed_ticks": n.missed_ticks}
