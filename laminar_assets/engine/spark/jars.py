"""The JVM libraries Spark needs beyond the pyspark wheel, pinned: s3a (hadoop-aws with the AWS SDK
v2 modules it uses, instead of the SDK's ~650 MB bundle) for lakes on S3; delta-spark (Delta Lake's
Spark connector and its storage layer), so that Spark SQL, `spark.read.format("delta")` and a Spark
Connect client can read and write the lake's tables as Delta tables; PostgreSQL's JDBC driver, for a Hive
metastore database on Postgres; and s3proxy, a local S3 server
with honest conditional writes, for the tests.

`python -m laminar_assets.deploy.jar_installer` (run by `make install`) downloads them once from
Maven Central into `<venv>/share/laminar/jars/<group>/`, checks each file's SHA-1 and size, and
never downloads a file it has. A Spark session Laminar builds (local, the Spark Connect server of
`laminar serve`, a cluster's driver, which ships them to its executors) puts the `s3` and `delta`
groups on its class path when they are installed (`installed`); without them everything Laminar
does works the same, only Spark then knows no `delta` format.

hadoop-aws matches the Hadoop the pinned pyspark ships (3.5.0 in pyspark 4.2.0); the SDK modules
are the ones hadoop-aws 3.5.0's s3a loads for reading, writing, listing and multipart copies.
delta-spark 4.4.0 is the release built for Spark 4.2; its other dependencies (the Delta kernel, a
Unity Catalog client, older Hadoop, Parquet and Jackson) are left out: the SQL commands, reads,
writes and the change data feed run without them, and the older copies would shadow nothing but
could only conflict.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

MAVEN = "https://repo1.maven.org/maven2"


@dataclass(frozen=True)
class Jar:
    """One artifact on Maven Central (`group:artifact:version`), with its SHA-1 and size."""

    coordinates: str
    sha1: str
    size: int
    classifier: str = ""

    @property
    def file_name(self) -> str:
        _group, artifact, version = self.coordinates.split(":")
        return f"{artifact}-{version}{'-' + self.classifier if self.classifier else ''}.jar"

    @property
    def url(self) -> str:
        group, artifact, version = self.coordinates.split(":")
        return f"{MAVEN}/{group.replace('.', '/')}/{artifact}/{version}/{self.file_name}"


GROUPS: dict[str, tuple[Jar, ...]] = {
    "s3": (
        Jar("software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3:1.3.1",
            "6c9bd0f6c440c9a78e82d272f5f0252d942419f6", 2473459),
        Jar("software.amazon.awssdk:annotations:2.35.4", "0ee2f050aafed2b3b9393472a4fb35eb91c74555", 13758),
        Jar("software.amazon.awssdk:apache-client:2.35.4", "406c25140a3a32ccd49ba3d752096a9fe2787ba3", 77013),
        Jar("software.amazon.awssdk:arns:2.35.4", "d915a3104773b44533bd6f618a8c7b28c2e9d8a0", 16323),
        Jar("software.amazon.awssdk:auth:2.35.4", "3a5f28f575d616813cad10a8db817984ed57d777", 241952),
        Jar("software.amazon.awssdk:aws-core:2.35.4", "2f288fa2bac08dde3e9c74950bc9a7fe04913371", 192161),
        Jar("software.amazon.awssdk:aws-query-protocol:2.35.4", "a4908689bc1285e192da926bd1d646d09d1d7def", 69369),
        Jar("software.amazon.awssdk:aws-xml-protocol:2.35.4", "3a8c83d91ba7b41c29a2d84826e293ec4fa51386", 102272),
        Jar("software.amazon.awssdk:checksums:2.35.4", "75d7256f1fa208224a3b23e2100941c0416f38a5", 69585),
        Jar("software.amazon.awssdk:checksums-spi:2.35.4", "36eba96eccfc87a5de204f72ad215ac362d28755", 8044),
        Jar("software.amazon.awssdk:crt-core:2.35.4", "eba7c2ddaef9938a072b4a6e58fd95ce8a7e0805", 17774),
        Jar("software.amazon.awssdk:endpoints-spi:2.35.4", "5fd0e9e47a6fdf05ea5906ac38e0bce1268ab9f0", 13168),
        Jar("software.amazon.eventstream:eventstream:1.0.1", "6ff8649dffc5190366ada897ba8525a836297784", 30193),
        Jar("org.apache.hadoop:hadoop-aws:3.5.0", "9e594525d264c0db653c7f68da98b245f7d61ea5", 938071),
        Jar("software.amazon.awssdk:http-auth:2.35.4", "ffa68c5e63d0f8ee9a5788029267cc450b5617c4", 17475),
        Jar("software.amazon.awssdk:http-auth-aws:2.35.4", "d149f075bc7b5631754cbb1adfcd2c77aa932a1b", 171754),
        Jar("software.amazon.awssdk:http-auth-aws-eventstream:2.35.4", "2590b41716ea3fd938fe614321da9c5367f6868c", 8705),
        Jar("software.amazon.awssdk:http-auth-spi:2.35.4", "8b280ce879d02d3da134e61e303d8e6c5eacc988", 48042),
        Jar("software.amazon.awssdk:http-client-spi:2.35.4", "3995875e3b834d39d708b661142949078babc34a", 91685),
        Jar("software.amazon.awssdk:identity-spi:2.35.4", "75e3168376548e375560e4595ba6a768458c87c1", 30963),
        Jar("software.amazon.awssdk:json-utils:2.35.4", "ca561bcb836814901bb8eda4089e451dcbf18024", 33225),
        Jar("software.amazon.awssdk:metrics-spi:2.35.4", "a2065eca2ade2adb2a937d4e671b52704cffbdc5", 27262),
        Jar("software.amazon.awssdk:netty-nio-client:2.35.4", "90acbbb695727eac973267f70d72bd95244d1d60", 292688),
        Jar("software.amazon.awssdk:profiles:2.35.4", "f9342cdd5f95a0d2f85bbedc3d25c3fc230beb51", 50524),
        Jar("software.amazon.awssdk:protocol-core:2.35.4", "54d8a6bdbe86852311b80d2a5b782995d6d7d0b7", 44371),
        Jar("org.reactivestreams:reactive-streams:1.0.4", "3864a1320d97d7b045f729a326e1e077661f31b7", 11640),
        Jar("software.amazon.awssdk:regions:2.35.4", "83ab2f31cd9932dc274aa418cd4cbd761cbca3c8", 962286),
        Jar("software.amazon.awssdk:retries:2.35.4", "02117c396b14d7db6c4b88d5c32b8380640a7bd0", 66309),
        Jar("software.amazon.awssdk:retries-spi:2.35.4", "22196f00e2560aa9c74b6a74f62b8bd51a4b94b6", 31487),
        Jar("software.amazon.awssdk:s3:2.35.4", "cc6cd77617d73cf9084d021e2693863bede49a4d", 4084242),
        Jar("software.amazon.awssdk:s3-transfer-manager:2.35.4", "6e4f2e5072fbc8551940eeed15220ddd11c684b2", 251117),
        Jar("software.amazon.awssdk:sdk-core:2.35.4", "7de70ccba4959d32e7a2ec549d312378413d36c9", 1040729),
        Jar("software.amazon.awssdk:third-party-jackson-core:2.35.4", "980758655bc742236478439d753c634858846d1c", 535001),
        Jar("software.amazon.awssdk:utils:2.35.4", "8bf086b3b751b058fa62e7f0398d94db7295ebbe", 241618),
        Jar("software.amazon.awssdk:utils-lite:2.35.4", "148d6b8801d9696c4cffff306dfdd3b96781af24", 8798),
    ),
    "delta": (
        Jar("io.delta:delta-spark_2.13:4.4.0", "c2ab26421b8de44a2161b5e0b7da7954049f1ca1", 9515916),
        Jar("io.delta:delta-storage:4.4.0", "a068e489ce20d7f79bc4ca2d3392f12adbb69ddd", 113863),
    ),
    "s3proxy": (
        Jar("org.gaul:s3proxy:4.1.0", "0a0b89e982bc1b1b5757d45b61109e05a840dd87", 54955934, "jar-with-dependencies"),
    ),
    # Google's GCS connector for Hadoop 3 (gs://), its shaded jar (its Google client libraries relocated,
    # so nothing on Spark's class path clashes): 4.0.x is built on Hadoop 3.4 for Java 17, and runs on
    # pyspark's Hadoop 3.5.0 (4.0.4 is the newest 4.0 release with a shaded jar on Maven Central).
    "gcs": (
        Jar("com.google.cloud.bigdataoss:gcs-connector:4.0.4", "7ffdc04d1cc08c742916c696805761044e36b919", 40521713,
            "shaded"),
    ),
}

# ABFS (abfss://) for lakes on Azure: hadoop-azure of the pinned pyspark's Hadoop (3.5.0, whose WASB driver is
# only a stub that says so: ABFS is the one connector) and HdrHistogram, its one dependency Spark's jars lack
# (httpclient, commons-lang3, Jackson and the shaded Guava are there); its azure-storage and wildfly-openssl
# dependencies served only WASB and native TLS, which ABFS over the JDK's TLS does not need.
GROUPS["azure"] = (
    Jar("org.apache.hadoop:hadoop-azure:3.5.0", "2431fc47c5a47c4299f0db5829a7af5c9b774340", 643815),
    Jar("org.hdrhistogram:HdrHistogram:2.1.12", "6eb7552156e0d517ae80cc2247be1427c8d90452", 173763),
)

# PostgreSQL's JDBC driver (pgjdbc, no dependencies: one jar) for a Hive metastore database on Postgres
# (`SparkOptions.metastore = "postgresql://..."`, docs/catalog.md): Spark's Hive client (the Hive 2.3 jars of the
# pyspark wheel) reaches its database through DataNucleus over JDBC, and the wheel ships Derby's driver only.
# A session with such a metastore puts it on the driver's class path (`spark.driver.extraClassPath`, where
# DataNucleus and java.sql.DriverManager find it), nothing else needs it.
GROUPS["postgres"] = (
    Jar("org.postgresql:postgresql:42.7.14", "0e7c94ce80cb1dd9875ff44ffe6a40a8aaa3eefd", 1221004),
)


def jar_dir(group: str, prefix: str | None = None) -> str:
    """Where the jars of `group` live in this interpreter's environment."""
    return os.path.join(prefix or sys.prefix, "share", "laminar", "jars", group)


def installed(group: str, prefix: str | None = None) -> list[str]:
    """The paths of `group`'s jars when every one of them is installed, else []."""
    folder = jar_dir(group, prefix)
    paths = [os.path.join(folder, j.file_name) for j in GROUPS[group]]
    return paths if all(os.path.isfile(p) and os.path.getsize(p) == j.size for p, j in zip(paths, GROUPS[group])) else []
