"""ROS 2 launch file: serve a robo-rl checkpoint on a robot (needs a ROS 2 install and robo-rl in the
same Python environment).

    ros2 launch launch/policy_node.launch.py checkpoint:=runs/<run> robot:=configs/robots/panda_sim.yaml

It only wires arguments to `robo-rl deploy`; topics, rates, safety limits and the transport come from
the robot config (``transport:=rclpy`` or ``cyclonedds`` overrides the config's transport). With
``managed:=true`` (rclpy) the lifecycle node waits for a lifecycle manager (e.g. nav2's
lifecycle_manager or ``ros2 lifecycle set /robo_rl_policy configure``) instead of configuring and
activating itself; ``params_file:=x.yaml`` passes ROS parameters (control_rate_hz, topic names).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, OpaqueFunction
from launch.substitutions import LaunchConfiguration


def _deploy(context, *_args, **_kwargs) -> list[ExecuteProcess]:
    cmd = ["robo-rl", "deploy", LaunchConfiguration("checkpoint").perform(context),
           "--robot", LaunchConfiguration("robot").perform(context)]
    transport = LaunchConfiguration("transport").perform(context)
    if transport:  # empty: the robot config's transport
        cmd += ["--transport", transport]
    if LaunchConfiguration("managed").perform(context).lower() in ("1", "true", "yes"):
        cmd.append("--managed")
    params = LaunchConfiguration("params_file").perform(context)
    if params:
        cmd += ["--ros-args", "--params-file", params]
    return [ExecuteProcess(cmd=cmd, output="screen", sigterm_timeout="5")]


def generate_launch_description() -> LaunchDescription:
    return LaunchDescription([
        DeclareLaunchArgument("checkpoint", description="robo-rl run directory or checkpoints/step_* directory"),
        DeclareLaunchArgument("robot", default_value="configs/robots/panda_sim.yaml", description="robot config"),
        DeclareLaunchArgument("transport", default_value="",
                              description="empty (the robot config's) | auto | rclpy | cyclonedds"),
        DeclareLaunchArgument("managed", default_value="false",
                              description="true: wait for lifecycle transitions from a manager (rclpy)"),
        DeclareLaunchArgument("params_file", default_value="", description="ROS parameters YAML for the node"),
        OpaqueFunction(function=_deploy),
    ])
