"""Loopback-only DDS settings for tests, benchmarks and sim-in-the-loop evaluation: nothing leaves
127.0.0.1 and a random ROS domain keeps concurrent runs apart.

``loopback_env(domain)`` returns the environment variables that confine both middlewares: Cyclone DDS
(``CYCLONEDDS_URI``: interface 127.0.0.1, multicast off, unicast peer 127.0.0.1) and Fast DDS 3 as used by
rclpy's ``rmw_fastrtps_cpp`` (``FASTDDS_DEFAULT_PROFILES_FILE``: one UDPv4 transport allow-listing
127.0.0.1, builtin transports off, initial peer 127.0.0.1), plus ``ROS_DOMAIN_ID``.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

CYCLONE_LOOPBACK = ('<CycloneDDS><Domain><General><Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces>'
                    '<AllowMulticast>false</AllowMulticast></General><Discovery><Peers><Peer address="127.0.0.1"/>'
                    '</Peers><ParticipantIndex>auto</ParticipantIndex><MaxAutoParticipantIndex>60'
                    '</MaxAutoParticipantIndex></Discovery></Domain></CycloneDDS>')

FASTDDS_LOOPBACK = """<?xml version="1.0" encoding="UTF-8"?>
<dds xmlns="http://www.eprosima.com">
  <profiles>
    <transport_descriptors>
      <transport_descriptor>
        <transport_id>udp_lo</transport_id>
        <type>UDPv4</type>
        <interfaces><allowlist><interface name="127.0.0.1"/></allowlist></interfaces>
      </transport_descriptor>
    </transport_descriptors>
    <participant profile_name="lo_only" is_default_profile="true">
      <rtps>
        <userTransports><transport_id>udp_lo</transport_id></userTransports>
        <useBuiltinTransports>false</useBuiltinTransports>
        <builtin>
          <metatrafficUnicastLocatorList>
            <locator><udpv4><address>127.0.0.1</address></udpv4></locator>
          </metatrafficUnicastLocatorList>
          <initialPeersList>
            <locator><udpv4><address>127.0.0.1</address></udpv4></locator>
          </initialPeersList>
        </builtin>
        <defaultUnicastLocatorList>
          <locator><udpv4><address>127.0.0.1</address></udpv4></locator>
        </defaultUnicastLocatorList>
      </rtps>
    </participant>
  </profiles>
</dds>
"""


def fastdds_profile_path() -> str:
    """Path of the Fast DDS loopback profile (written once per process into the temp directory)."""
    path = Path(tempfile.gettempdir()) / f"robo_rl_fastdds_loopback_{os.getuid()}.xml"
    if not path.exists() or path.read_text() != FASTDDS_LOOPBACK:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(FASTDDS_LOOPBACK)
        os.replace(tmp, path)
    return str(path)


def random_domain() -> int:
    """A ROS domain id in 10..200 (valid for both middlewares' default port mapping)."""
    return random.randint(10, 200)


def loopback_env(domain: int) -> dict[str, str]:
    """Environment variables confining Cyclone DDS and Fast DDS 3 (rclpy) to loopback on ``domain``."""
    return {"CYCLONEDDS_URI": CYCLONE_LOOPBACK, "FASTDDS_DEFAULT_PROFILES_FILE": fastdds_profile_path(),
            "ROS_DOMAIN_ID": str(domain), "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp"}
