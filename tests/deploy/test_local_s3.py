"""The local S3 server (deploy/local_s3.py): its request counts and where its recording lives."""

from __future__ import annotations

import os

from laminar_assets.deploy.local_s3 import LocalS3


def test_it_counts_requests_by_kind_only_while_counting_and_leaves_no_file_behind(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # moto's recorder used to write `moto_recording` into the working directory
    with LocalS3() as server:
        server.create_bucket("counted")
        client = server.options.client()
        client.put_object(Bucket="counted", Key="before", Body=b"not counted")
        server.start_counting()
        client.put_object(Bucket="counted", Key="a/b", Body=b"x")
        client.get_object(Bucket="counted", Key="a/b")
        client.head_object(Bucket="counted", Key="a/b")
        client.list_objects_v2(Bucket="counted", Prefix="a/")
        client.delete_object(Bucket="counted", Key="a/b")
        assert server.counts() == {"PUT": 1, "GET": 1, "HEAD": 1, "LIST": 1, "DELETE": 1}
        recording = server._recording_dir
        assert recording and os.path.isdir(recording)
    assert not os.path.exists(recording)
    assert os.listdir(tmp_path) == []
