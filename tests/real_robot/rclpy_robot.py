"""A robot played by a plain rclpy process (rclpy's public API and the standard message packages only,
no robo-rl code), for tests of the policy node over a real ROS 2 stack.

    python rclpy_robot.py '<json spec>'

It publishes sensor_msgs/JointState (reliable) at ``rate`` Hz with the positions it was last commanded
(a perfectly tracking arm), optionally a camera (sensor_msgs/Image, ``camera_qos`` sensor_data or
reliable) and a std_msgs/String instruction; it receives Float64MultiArray or JointTrajectory commands
and runs ``events`` one after another, each ``after`` seconds after the previous one (the first after the
first command arrived, or after the start with ``"events_from": "start"``): ``{"estop": bool}`` publishes
std_msgs/Bool on /estop, ``{"push": [..], "hold": s}`` moves the arm (as a person pushing it would) and keeps it there
for ``s`` seconds (default 0) whatever is commanded, as a hand holding it would, ``{"reset":
true}`` calls the ``reset_service`` (std_srvs/Trigger), ``{"silent": d}`` stops publishing for d seconds,
``{"transition": "configure"|"activate"|...}`` asks the policy node's lifecycle service
(lifecycle_msgs/ChangeState; ``"wait": true`` blocks until it answered), ``{"end": true}`` ends the run. Each event's wall-clock time is
reported. It also keeps the last diagnostic_msgs/DiagnosticArray statuses from /diagnostics.
It prints ``READY`` when the first command arrived and, when ``seconds`` passed or no command came for
``quiet_exit`` seconds after commands started, one JSON line: the commands with their wall-clock
arrival times, the positions published, and the reset replies.
"""

import json
import sys
import threading
import time

import rclpy
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Bool, Float64MultiArray, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory


def main() -> None:
    spec = json.loads(sys.argv[1])
    names = spec["joints"]
    q = list(spec.get("q0", [0.0] * len(names)))
    rclpy.init()
    node = rclpy.create_node("test_robot")
    reliable = QoSProfile(depth=10)
    js_pub = node.create_publisher(JointState, spec.get("joint_states_topic", "/joint_states"), reliable)
    estop_pub = node.create_publisher(Bool, "/estop", reliable)
    instr_pub = node.create_publisher(String, "/task_instruction", reliable)
    cam = spec.get("camera")
    cam_pub = None
    if cam:
        qos = qos_profile_sensor_data if spec.get("camera_qos", "sensor_data") == "sensor_data" else reliable
        cam_pub = node.create_publisher(Image, cam["topic"], qos)
    lock = threading.Lock()
    commands: list = []
    published: list = []
    replies: list = []
    trajectory = spec.get("command_type", "Float64MultiArray") == "JointTrajectory"
    held_until = [0.0]  # a push holding the arm: commands do not move it before this time

    def on_command(msg) -> None:
        now = time.time()
        with lock:
            free = now >= held_until[0]
            if trajectory:
                pts = [list(p.positions) for p in msg.points]
                times = [p.time_from_start.sec + 1e-9 * p.time_from_start.nanosec for p in msg.points]
                commands.append({"t": now, "points": pts, "times": times, "joint_names": list(msg.joint_names)})
                if pts and free:
                    q[:] = pts[0]
            else:
                commands.append({"t": now, "data": list(msg.data)})
                if len(msg.data) == len(q) and free:
                    q[:] = list(msg.data)

    node.create_subscription(JointTrajectory if trajectory else Float64MultiArray, spec["command_topic"], on_command,
                             reliable)
    reset_client = node.create_client(Trigger, spec.get("reset_service", "/robo_rl_policy/reset_estop"))
    change_client = node.create_client(ChangeState, spec.get("lifecycle_service", "/robo_rl_policy/change_state"))
    diagnostics: list = []

    def on_diagnostics(msg) -> None:
        for st in msg.status:
            with lock:
                diagnostics.append({"t": time.time(), "level": int.from_bytes(st.level, "little")
                                    if isinstance(st.level, bytes) else int(st.level), "name": st.name,
                                    "message": st.message, "values": {kv.key: kv.value for kv in st.values}})

    node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, reliable)
    transitions = {"configure": Transition.TRANSITION_CONFIGURE, "activate": Transition.TRANSITION_ACTIVATE,
                   "deactivate": Transition.TRANSITION_DEACTIVATE, "cleanup": Transition.TRANSITION_CLEANUP}
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinning = threading.Event()
    spinning.set()

    def spin() -> None:
        while spinning.is_set():
            executor.spin_once(timeout_sec=0.05)

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()

    def stamp() -> Time:
        now = time.time() - spec.get("stamp_lag", 0.0)
        return Time(sec=int(now), nanosec=int((now % 1) * 1e9))

    def on_reset_done(fut) -> None:
        res = fut.result()
        with lock:
            replies.append({"t": time.time(), "success": bool(res.success), "message": res.message})

    events = list(spec.get("events", []))
    done_events: list = []
    from_start = spec.get("events_from", "ready") == "start"
    period = 1.0 / spec.get("rate", 30.0)
    start = time.time()
    end = start + spec.get("seconds", 30.0)
    quiet = spec.get("quiet_exit", 2.0)
    ready = False
    silent_until = 0.0
    last_event = start if from_start else None
    pixels = bytes([7]) * (cam["height"] * cam["width"] * 3) if cam else b""
    instr_pub.publish(String(data=spec.get("instruction", "push the cube")))
    while time.time() < end:
        now = time.time()
        while events and last_event is not None and now - last_event >= events[0].get("after", 0.0):
            ev = events.pop(0)
            if "estop" in ev:
                estop_pub.publish(Bool(data=bool(ev["estop"])))
            if "push" in ev:
                with lock:
                    q[:] = ev["push"]
                    held_until[0] = time.time() + float(ev.get("hold", 0.0))
            if ev.get("reset"):
                reset_client.wait_for_service(timeout_sec=5.0)
                reset_client.call_async(Trigger.Request()).add_done_callback(on_reset_done)
            if "transition" in ev:
                change_client.wait_for_service(timeout_sec=30.0)
                req = ChangeState.Request()
                req.transition.id = transitions[ev["transition"]]
                fut = change_client.call_async(req)
                fut.add_done_callback(lambda f, name=ev["transition"]: replies.append(
                    {"t": time.time(), "transition": name, "success": bool(f.result().success)}))
                while ev.get("wait") and not fut.done():
                    time.sleep(0.01)
            if "silent" in ev:
                silent_until = time.time() + ev["silent"]
            if ev.get("end"):
                end = 0.0
            now = last_event = time.time()
            done_events.append({**ev, "t": now})
        if now >= silent_until:
            with lock:
                pos = list(q)
            msg = JointState(name=names, position=pos, velocity=[0.0] * len(names))
            msg.header.stamp = stamp()
            js_pub.publish(msg)
            published.append({"t": now, "q": pos})
            if cam_pub is not None:
                img = Image(height=cam["height"], width=cam["width"], encoding="rgb8", step=cam["width"] * 3,
                            data=pixels)
                img.header.stamp = stamp()
                cam_pub.publish(img)
        with lock:
            n, last_t = len(commands), (commands[-1]["t"] if commands else None)
        if n and not ready:
            ready = True
            if last_event is None:
                last_event = time.time()
            print("READY", flush=True)
        if last_t is not None and now - last_t > quiet and not events:
            break
        time.sleep(max(0.0, period - (time.time() - now)))
    with lock:
        out = {"commands": commands, "published": published[-400:], "replies": replies,
               "diagnostics": diagnostics[-3:], "events": done_events}
    print(json.dumps(out), flush=True)
    spinning.clear()
    spinner.join()
    executor.shutdown()
    node.destroy_node()
    rclpy.try_shutdown()


if __name__ == "__main__":
    main()
