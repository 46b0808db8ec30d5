// The upload page of app/upload_route.py: sends the chosen file as the body of
// PUT /api/datasets/NAME with the ticket that the New run page put in this page's
// URL fragment (#ticket=...), which never reaches a server or its logs.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const ticket = new URLSearchParams(location.hash.slice(1)).get("ticket");
  const file = document.getElementById("file");
  const send = document.getElementById("send");
  const progress = document.getElementById("progress");
  const result = document.getElementById("result");
  if (!ticket) {
    result.textContent = "This page needs a ticket: open it from the New run page.";
    return;
  }
  file.addEventListener("change", () => { send.disabled = !file.files.length; });
  send.addEventListener("click", () => {
    const chosen = file.files[0];
    const request = new XMLHttpRequest();
    request.open("PUT", "/api/datasets/" + encodeURIComponent(chosen.name));
    request.setRequestHeader("Authorization", "Bearer " + ticket);
    request.upload.addEventListener("progress", (e) => {
      progress.hidden = false;
      progress.value = e.lengthComputable ? e.loaded / e.total : 0;
    });
    request.addEventListener("load", () => {
      send.disabled = false;
      if (request.status === 200) {
        const kept = JSON.parse(request.responseText);
        result.textContent = chosen.name + ": " + kept.rows + " prompts, saved as " +
          kept.train_file + ". Choose it as the training dataset (train_file) in the New run form.";
      } else {
        result.textContent = "Refused (" + request.status + "): " + request.responseText;
      }
    });
    request.addEventListener("error", () => {
      send.disabled = false;
      result.textContent = "The upload failed: the connection was closed (too large, or the ticket refused?).";
    });
    send.disabled = true;
    result.textContent = "Uploading " + chosen.name + "...";
    request.send(chosen);
  });
});
